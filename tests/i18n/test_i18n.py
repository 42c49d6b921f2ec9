"""The translation function, the language choice, the .po reader and the catalog check."""

from __future__ import annotations

import argparse
import textwrap

import pytest

from portachat.i18n import _, language, ngettext
from portachat.i18n.argparse_messages import translate_argparse
from portachat.i18n.check import check, extract
from portachat.i18n.po import Entry, read_po, write_po

LOCALE_VARS = ("PORTACHAT_LANG", "LANGUAGE", "LC_ALL", "LC_MESSAGES", "LANG")


@pytest.fixture
def env(monkeypatch):
    for var in LOCALE_VARS:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({}, "en"),
        ({"LANG": "zh_CN.UTF-8"}, "zh"),
        ({"LANG": "C"}, "en"),
        ({"LANG": "en_US.UTF-8", "LC_ALL": "zh_TW.UTF-8"}, "zh"),  # LC_ALL wins over LANG
        ({"LANGUAGE": "zh_CN:en", "LANG": "en_US.UTF-8"}, "zh"),
        ({"LC_MESSAGES": "de_DE.UTF-8", "LANG": "zh_CN.UTF-8"}, "en"),  # the first set one decides
        ({"PORTACHAT_LANG": "en", "LANG": "zh_CN.UTF-8"}, "en"),
        ({"PORTACHAT_LANG": "zh", "LANG": "C"}, "zh"),
    ],
)
def test_language_choice(env, settings, expected):
    for var, value in settings.items():
        env.setenv(var, value)
    assert language() == expected


def test_translation_follows_the_language(env):
    assert _("usage: ") == "usage: "
    env.setenv("PORTACHAT_LANG", "zh")
    assert _("usage: ") == "用法："
    assert _("a message nobody wrote down") == "a message nobody wrote down"  # falls back to English
    assert ngettext("{n} file", "{n} files", 2) == "{n} files"


def test_argparse_speaks_the_language(env, capsys):
    translate_argparse()
    parser = argparse.ArgumentParser(prog="demo")
    parser.add_argument("--steps", type=int, required=True)
    env.setenv("PORTACHAT_LANG", "zh")
    with pytest.raises(SystemExit):
        parser.parse_args([])
    assert "demo: 错误：缺少以下必需参数：--steps" in capsys.readouterr().err
    env.setenv("PORTACHAT_LANG", "en")
    with pytest.raises(SystemExit):
        parser.parse_args([])
    assert "demo: error: the following arguments are required: --steps" in capsys.readouterr().err


def test_po_round_trip(tmp_path):
    path = tmp_path / "x.po"
    path.write_text(textwrap.dedent('''\
        # header comment
        msgid ""
        msgstr ""
        "Language: zh\\n"

        #: a.py
        msgid "two "
        "lines with \\"quotes\\"\\n"
        msgstr "两行"

        #, fuzzy
        msgid "unsure"
        msgstr "不确定"

        msgid "{n} file"
        msgid_plural "{n} files"
        msgstr[0] "{n} 个文件"
        '''), encoding="utf-8")
    entries = read_po(path)
    assert [e.msgid for e in entries] == ["", 'two lines with "quotes"\n', "unsure", "{n} file"]
    assert entries[0].msgstr == "Language: zh\n"
    assert entries[1].translated and not entries[2].translated  # fuzzy counts as untranslated
    assert entries[3].msgid_plural == "{n} files" and entries[3].msgstr_plural == {0: "{n} 个文件"}
    write_po(tmp_path / "y.po", entries)
    again = read_po(tmp_path / "y.po")
    assert again == entries
    with pytest.raises(ValueError, match="x.po:2"):
        (tmp_path / "x.po").write_text('msgid ""\nmsgstr unquoted\n', encoding="utf-8")
        read_po(tmp_path / "x.po")


def test_the_real_catalog_covers_the_code():
    messages, _problems = extract()
    assert len(messages) > 10  # the check looked at real code
    assert check() == [], "run: python -m portachat.i18n.check --update, then fill in the msgstr"


def test_the_check_fails_on_untranslated_and_broken_messages(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    module = pkg / "new_feature.py"
    module.write_text(textwrap.dedent('''\
        from portachat.i18n import _, N_

        TITLE = N_("usage: ")

        def report(n):
            print(_("A brand-new message nobody translated"))
            print(_(f"{n} steps"))

        def loop():
            for _ in range(3):
                print(_("usage: "))
        '''), encoding="utf-8")
    catalog = tmp_path / "zh.po"
    write_po(catalog, [Entry("usage: ", "用法："), Entry("{n} left", "还剩 {m}")])
    problems = check([module], catalog=catalog, root=pkg)
    assert any("no Chinese for 'A brand-new message nobody translated'" in p for p in problems)
    assert any("new_feature.py:7: _() needs a literal string" in p for p in problems)
    assert any("new_feature.py:10: `_` is rebound" in p for p in problems)
    assert len(problems) == 3, problems
    module.write_text('from portachat.i18n import _\nprint(_("{n} left").format(n=1))\n', encoding="utf-8")
    assert check([module], catalog=catalog, root=pkg) == [
        "pkg/new_feature.py:2: placeholders differ in the translation of '{n} left'"
    ]
    module.write_text('from portachat.i18n import _\nprint(_("usage: "))\n', encoding="utf-8")
    assert check([module], catalog=catalog, root=pkg) == []


def test_the_check_finds_error_and_progress_text_that_bypasses_the_catalog(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    module = pkg / "stage.py"
    module.write_text(textwrap.dedent('''\
        from portachat.i18n import _

        class StageError(RuntimeError):
            pass

        def run(say, n, stage, table):
            say(f"[portachat] step {n} done")
            say("[portachat] " + _("usage: "))
            say(f"[speedrun] ---- {stage} " + "-" * 10)
            say(f"[speedrun] {stage}:\\n{table}")
            if n < 0:
                raise StageError("n must not be negative")
            raise StageError(_("usage: "))
        '''), encoding="utf-8")
    catalog = tmp_path / "zh.po"
    write_po(catalog, [Entry("usage: ", "用法：")])
    assert check([module], catalog=catalog, root=pkg) == [
        "pkg/stage.py:7: the message of say() is not passed through _()",
        "pkg/stage.py:12: the message of StageError() is not passed through _()",
    ]


def test_the_check_reads_the_message_argument_of_http_and_cli_errors(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "errors.py").write_text(textwrap.dedent('''\
        class APIError(Exception):
            def __init__(self, status, message, param=None, code=None):
                super().__init__(message)

        class LoadFailed(RuntimeError):
            pass

        class _Refused(ValueError):
            pass
        '''), encoding="utf-8")
    module = pkg / "routes.py"
    module.write_text(textwrap.dedent('''\
        import argparse

        from portachat.i18n import _

        def route(x, n):
            if x == 1:
                raise APIError(400, "Bad thing happened here")
            if x == 2:
                raise APIError(400, f"bad {x} value here", param="messages")
            if x == 3:
                raise APIError(status=400, message="the model is not served")
            if x == 4:
                raise LoadFailed(f"loading {x} failed")
            if x == 5:
                raise SystemExit("--models-dir is not a directory")
            if x == 6:
                raise argparse.ArgumentTypeError(f"{x} is not a number")
            if x == 7:
                return error_response(404, "no such file", "file_id", "not_found")
            if x == 8:
                raise _Refused("number too large")
            if x == 9:
                raise APIError(400, _("usage: "), "messages", "context_length_exceeded")
            if x == 10:
                raise APIError(400, _("usage: "), param="messages", code="context_length_exceeded")
            if x == 11:
                raise SystemExit(_("usage: ") + str(n))
            if x == 12:
                raise APIError(500, n or "the engine failed on this request")
            if x == 13:  # a command's name before its message and a field path are not sentences
                raise SystemExit("portachat serve: " + _("usage: "))
            if x == 14:
                raise LoadFailed(_("usage: "), "response_format.json_schema")
            raise LoadFailed(n or _("usage: "))
        '''), encoding="utf-8")
    catalog = tmp_path / "zh.po"
    write_po(catalog, [Entry("usage: ", "用法：")])
    assert check([module], catalog=catalog, root=pkg) == [
        "pkg/routes.py:7: the message of APIError() is not passed through _()",
        "pkg/routes.py:9: the message of APIError() is not passed through _()",
        "pkg/routes.py:11: the message of APIError() is not passed through _()",
        "pkg/routes.py:13: the message of LoadFailed() is not passed through _()",
        "pkg/routes.py:15: the message of SystemExit() is not passed through _()",
        "pkg/routes.py:17: the message of ArgumentTypeError() is not passed through _()",
        "pkg/routes.py:19: the message of error_response() is not passed through _()",
        "pkg/routes.py:29: the message of APIError() is not passed through _()",
    ]


def test_help_wraps_chinese_by_display_width():
    from portachat.i18n.argparse_messages import wrap
    from portachat.i18n.width import display_width

    text = "在对话数据上进行监督微调（每行一段对话并填充，低学习率）。除非 --init 另行指定，从 mid 检查点开始。"
    lines = wrap(text, 30)
    assert len(lines) > 2 and all(display_width(line) <= 32 for line in lines)  # a closing mark may hang over
    assert not any(line[0] in "，。）：" for line in lines)
    assert "".join(lines).replace(" ", "") == text.replace(" ", "")  # nothing lost, words kept whole
    assert any("--init" in line for line in lines)


def test_gnu_gettext_reads_the_catalog_as_we_do(tmp_path):
    import gettext
    import shutil
    import subprocess

    from portachat.i18n import CATALOG

    if shutil.which("msgfmt") is None:
        pytest.skip("GNU gettext's msgfmt is not installed")
    mo = tmp_path / "portachat.mo"
    subprocess.run(["msgfmt", "--check", "-o", str(mo), str(CATALOG["zh"])], check=True)
    with mo.open("rb") as f:
        gnu = gettext.GNUTranslations(f)
    entries = [e for e in read_po(CATALOG["zh"]) if e.msgid and e.msgid_plural is None]
    assert len(entries) > 100 and all(gnu.gettext(e.msgid) == e.msgstr for e in entries)


def test_wrap_help_wraps_literals_and_reports_fstrings():
    from portachat.i18n.wrap_help import wrap_source

    src = textwrap.dedent('''\
        import argparse


        def register(sub, n):
            p = sub.add_parser("x", help="do x", description="Does x "
                               "well.")
            p.add_argument("--n", help=f"count (default {n})")
            p.add_argument("--m", help=_("already wrapped"))
        ''')
    out, wrapped, left = wrap_source(src, "cmd.py")
    assert wrapped == 2 and left == ["cmd.py:7: f-string help="]
    assert 'help=_("do x"), description=_("Does x "' in out and '"well."))' in out
    assert out.count("from portachat.i18n import _") == 1 and 'help=_(_("already' not in out
    compile(out, "cmd.py", "exec")


def test_wrap_help_puts_the_import_in_order():
    from portachat.i18n.wrap_help import wrap_source

    src = "import argparse\n\nfrom portachat.commands.common import flag\nfrom portachat.serve import x\n\n" \
          "def f(p):\n    flag(p, '--a', help='a')\n"
    out, _n, _left = wrap_source(src)
    assert "from portachat.commands.common import flag\nfrom portachat.i18n import _\nfrom portachat.serve import x" in out
