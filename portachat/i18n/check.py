"""The catalog check: every message passed to _() / N_() / ngettext() in portachat/ has Chinese.

    python -m portachat.i18n.check            list problems, exit 1 if any
    python -m portachat.i18n.check --update   also add missing messages (empty msgstr) to the .po

Problems found: a message with no (or a fuzzy) msgstr, a msgstr whose {placeholders} differ from
the msgid's (str.format would fail), a non-literal argument (an f-string can never be in the
catalog), a function that rebinds `_` (e.g. `for _ in ...`) while also calling _(), and text that
reaches a user without _(): a string literal or f-string given as the message of portachat's own
exceptions (classes named ...Error defined in the package), of an HTTP error (`APIError`,
`error_response`, `error_body`), of a CLI exit (`SystemExit`, `argparse.ArgumentTypeError`) or of a
progress line (`say(...)`). A bracketed prefix such as `"[portachat] " + _(...)` is not text; nor are
the identifiers given as `param=`, `code=`, `type=`, `kind=` or `name=` (OpenAI's error codes).
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from portachat.i18n import CATALOG
from portachat.i18n.po import Entry, read_po, write_po

PACKAGE = Path(__file__).resolve().parents[1]
MARKERS = {"_": 1, "N_": 1, "ngettext": 2}  # function name -> how many leading literal arguments
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)  # their variables are their own
USER_FACING_CALLS = {"say", "APIError", "error_response", "error_body", "SystemExit", "ArgumentTypeError"}
# besides portachat's own ...Error classes. The HTTP error helpers take (status, message, param, code):
# only their second positional argument is a sentence, the others are numbers and identifiers.
MESSAGE_POSITION = {"APIError": 1, "error_response": 1, "error_body": 1}
NOT_MESSAGE_KEYWORDS = {"param", "code", "type", "kind", "name"}  # identifiers clients match on
_PREFIX = re.compile(r"^\s*\[[\w -]+\]")  # "[portachat] ": a log prefix, not text
# Not sentences either: a command's name before its message ("portachat serve: ", as argparse prints it)
# and a field path ("response_format.json_schema", "messages[0]") passed as a parameter name.
_NOT_TEXT = re.compile(r"^\s*portachat( [a-z-]+)*:\s*$|^[\w.\[\]]+$")
_PLACEHOLDER = re.compile(r"\{[^{}]*\}|%%|%\([^)]*\)[a-z]|%[sdr]")  # %% too: argparse %-formats help


@dataclass(frozen=True)
class Message:
    msgid: str
    plural: str | None
    where: str  # "path:line"


def _imports_i18n(tree: ast.Module) -> bool:
    return any(isinstance(n, ast.ImportFrom) and n.module == "portachat.i18n" for n in ast.walk(tree))


def _own_nodes(scope: ast.AST):
    """Nodes of a scope, not descending into nested functions or comprehensions (own scopes)."""
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, _SCOPES + _COMPREHENSIONS):
            stack.extend(ast.iter_child_nodes(node))


def _calls_underscore(scope: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "_" for n in ast.walk(scope))


def _rebinds_underscore(scope: ast.AST) -> int | None:
    for node in _own_nodes(scope):
        if isinstance(node, ast.Name) and node.id == "_" and isinstance(node.ctx, ast.Store):
            return node.lineno
    return None


def extract_file(path: Path, root: Path) -> tuple[list[Message], list[str]]:
    """Messages in one module and the problems that make some of them untranslatable."""
    rel = path.relative_to(root.parent) if path.is_relative_to(root.parent) else path
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    if not _imports_i18n(tree):
        return [], []
    messages: list[Message] = []
    problems: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in MARKERS:
            need = MARKERS[node.func.id]
            args = node.args[:need]
            where = f"{rel}:{node.lineno}"
            if len(args) < need or not all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in args):
                problems.append(f"{where}: {node.func.id}() needs a literal string (use .format for values)")
                continue
            messages.append(Message(args[0].value, args[1].value if need == 2 else None, where))
    scopes = [tree, *(n for n in ast.walk(tree) if isinstance(n, _SCOPES))]
    for scope in scopes:
        line = _rebinds_underscore(scope)
        if line is not None and _calls_underscore(scope):
            problems.append(f"{rel}:{line}: `_` is rebound in a scope that calls _(); rename the variable")
    return messages, problems


def _base_name(node: ast.expr) -> str:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


def own_error_classes(root: Path = PACKAGE) -> set[str]:
    """The exception classes portachat defines (by name): their messages reach users. A class is one
    when its name ends in Error or it derives from an ...Error / ...Exception / another of them (NoRoom,
    LoadFailed); private ones (`_Refused`) are caught inside their module and never shown."""
    bases: dict[str, list[str]] = {}
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                bases.setdefault(node.name, []).extend(_base_name(b) for b in node.bases)
    names = {n for n in bases if n.endswith("Error")}
    names |= {n for n, bs in bases.items() if any(b.endswith(("Error", "Exception")) for b in bs)}
    grew = True
    while grew:  # subclasses of our own exceptions, however deep
        more = {n for n, bs in bases.items() if n not in names and any(b in names for b in bs)}
        names |= more
        grew = bool(more)
    return names


def _has_words(text: str) -> bool:
    return not _NOT_TEXT.match(text) and any(c.isalpha() for c in _PREFIX.sub("", text))


def _bare_text(node: ast.AST) -> bool:
    """Whether an expression carries words of its own outside _(): a literal or an f-string with letters
    beyond a bracketed log prefix (punctuation, rules and values alone are not text), also as a fallback
    (`a or "text"`) or a branch (`"x" if c else "y"`)."""
    if isinstance(node, ast.JoinedStr):
        return any(isinstance(v, ast.Constant) and _has_words(v.value) for v in node.values)
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return _has_words(node.value)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _bare_text(node.left) or _bare_text(node.right)
    if isinstance(node, ast.BoolOp):  # `exc.error or "the engine failed"`: the fallback reaches users
        return any(_bare_text(v) for v in node.values)
    if isinstance(node, ast.IfExp):
        return _bare_text(node.body) or _bare_text(node.orelse)
    return False


def _message_arguments(name: str, call: ast.Call) -> list[ast.expr]:
    """The arguments of a user-facing call that may carry its message (not its status or codes)."""
    position = MESSAGE_POSITION.get(name)
    positional = call.args if position is None else call.args[position:position + 1]
    return [*positional, *(k.value for k in call.keywords if k.arg not in NOT_MESSAGE_KEYWORDS)]


def untranslated_text(path: Path, root: Path, sinks: set[str]) -> list[str]:
    """Calls in one module whose user-facing message is text that bypasses _()."""
    rel = path.relative_to(root.parent) if path.is_relative_to(root.parent) else path
    problems = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        if name in sinks and any(_bare_text(a) for a in _message_arguments(name, node)):
            problems.append((node.lineno, f"{rel}:{node.lineno}: the message of {name}() is not passed through _()"))
    return [text for _line, text in sorted(problems)]


def extract(paths: list[Path] | None = None, root: Path = PACKAGE) -> tuple[list[Message], list[str]]:
    messages: list[Message] = []
    problems: list[str] = []
    for path in sorted(paths if paths is not None else root.rglob("*.py")):
        found, bad = extract_file(path, root)
        messages += found
        problems += bad
    return messages, problems


def _placeholders(text: str) -> list[str]:
    return sorted(_PLACEHOLDER.findall(text))


def check(paths: list[Path] | None = None, catalog: Path = CATALOG["zh"], root: Path = PACKAGE) -> list[str]:
    """Every problem as one line; an empty list means the catalog covers the code."""
    messages, problems = extract(paths, root)
    sinks = USER_FACING_CALLS | own_error_classes(root)
    for path in sorted(paths if paths is not None else root.rglob("*.py")):
        if "i18n" not in path.relative_to(root).parts:  # the catalog tools talk to developers
            problems += untranslated_text(path, root, sinks)
    entries = {e.msgid: e for e in read_po(catalog) if e.msgid}
    for m in messages:
        e = entries.get(m.msgid)
        if e is None or not e.translated:
            problems.append(f"{m.where}: no Chinese for {m.msgid!r}")
            continue
        for text in [e.msgstr] if e.msgid_plural is None else list(e.msgstr_plural.values()):
            if _placeholders(text) != _placeholders(m.msgid):
                problems.append(f"{m.where}: placeholders differ in the translation of {m.msgid!r}")
    return problems


def update(paths: list[Path] | None = None, catalog: Path = CATALOG["zh"], root: Path = PACKAGE) -> int:
    """Append messages missing from the .po (empty msgstr, to be filled in); returns how many."""
    messages, _problems = extract(paths, root)
    entries = read_po(catalog)
    known = {e.msgid for e in entries}
    added = 0
    for m in messages:
        if m.msgid not in known:
            entries.append(Entry(m.msgid, msgid_plural=m.plural, msgstr_plural={0: ""} if m.plural else {},
                                 comments=[f"#: {m.where.rsplit(':', 1)[0]}"]))
            known.add(m.msgid)
            added += 1
    if added:
        write_po(catalog, entries)
    return added


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Check that every translatable message has Chinese.")
    p.add_argument("--update", action="store_true", help="add missing messages to the .po with an empty msgstr")
    args = p.parse_args(argv)
    if args.update:
        print(f"added {update()} message(s) to {CATALOG['zh']}")
    problems = check()
    for line in problems:
        print(line, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
