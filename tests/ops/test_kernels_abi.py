"""The C kernels' interface check: the built library reports what cpu_kernels mirrors in ctypes, and a
difference on either side (the Python mirror, or the C that was compiled) keeps PyTorch's kernels with
the reason printed once, never a call through a wrong mirror."""

from __future__ import annotations

import ctypes
import shutil

import pytest

from portachat.ops import cpu_kernels as ck

QUICK = ("-O0", "-fopenmp", "-shared", "-fPIC")  # these tests read the interface, not the speed


@pytest.fixture
def fresh_library():
    """library() computed anew inside the test and again after it (other tests keep the real one)."""
    ck.library.cache_clear()
    yield
    ck.library.cache_clear()


@pytest.fixture
def sources(tmp_path, monkeypatch):
    """A copy of the kernels' sources that the test may edit; build() compiles the copy."""
    if ck.compiler() is None:
        pytest.skip("no C compiler")
    copy = tmp_path / "kernels"
    shutil.copytree(ck.KERNELS, copy)
    monkeypatch.setattr(ck, "SOURCES", tuple(sorted(copy.glob("*.c"))))
    return copy


def _edit(path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, (path, old)
    path.write_text(text.replace(old, new))


def test_the_built_library_reports_what_python_mirrors(fresh_library):
    lib = ck.library()
    if lib is None:
        pytest.skip("no C compiler: the kernels are not built here")
    reported = ck.reported_abi(lib)
    expected = ck.expected_abi()
    assert set(expected) <= set(reported)
    assert ck.abi_differences(lib) == []
    # the mirror covers every entry point the library has and each field of its Product
    assert {name for name in reported if name.startswith("portachat_")} == set(ck.ENTRY_POINTS)
    assert (
        len(reported["portachat_gemv"]) == len("i:") + 19
        and len(reported["portachat_decode_layers"]) == 2 + 21
    )
    assert int(reported["sizeof.Product"]) == ctypes.sizeof(ck._Product)


def test_a_python_mirror_that_differs_keeps_pytorch_and_says_why_once(fresh_library, monkeypatch, capsys):
    if ck.compiler() is None:
        pytest.skip("no C compiler")
    signature = ck.ENTRY_POINTS["portachat_gemv"]
    monkeypatch.setitem(ck.ENTRY_POINTS, "portachat_gemv", signature + "i")  # an argument too many
    monkeypatch.setitem(ck.WEIGHT_KINDS, "int4", 4)
    assert ck.library() is None
    err = capsys.readouterr().err
    assert "CPU kernels unavailable, using PyTorch's" in err
    assert f"portachat_gemv: library {signature}, portachat {signature}i" in err
    assert "weight.int4: library 3, portachat 4" in err
    assert ck.library() is None and capsys.readouterr().err == ""  # said once per process
    monkeypatch.undo()
    ck.library.cache_clear()
    assert ck.library() is not None  # the same build, with the mirror as it is, loads


def test_a_struct_mirror_that_differs_is_refused(fresh_library, monkeypatch, capsys):
    if ck.compiler() is None:
        pytest.skip("no C compiler")

    class Product(ctypes.Structure):  # bias dropped: the C struct is 8 bytes longer than this one
        _fields_ = [(name, kind) for name, kind in ck._Product._fields_ if name != "bias"]

    monkeypatch.setattr(ck, "_Product", Product)
    assert ck.library() is None
    err = capsys.readouterr().err
    assert f"sizeof.Product: library {ctypes.sizeof(Product) + 8}, portachat {ctypes.sizeof(Product)}" in err


def test_a_library_compiled_with_another_struct_is_refused(sources, tmp_path):
    # C drifts from Python: a field added to Weight moves every field after it in Product
    _edit(
        sources / "kernels.h",
        "    int kind;\n    const void *w;",
        "    int kind;\n    const void *spare;\n    const void *w;",
    )
    path = ck.build(QUICK, out=tmp_path / "drifted.so")
    with pytest.raises(RuntimeError, match="does not have the interface portachat expects") as e:
        ck.load(path)
    assert "Product.w: library 16, portachat 8" in str(e.value)
    assert "portachat_gemv" not in str(e.value)  # what agrees is not listed
    # the unchanged copy loads, so the refusal is the edit's doing
    _edit(sources / "kernels.h", "    const void *spare;\n", "")
    assert ck.abi_differences(ck.load(ck.build(QUICK, out=tmp_path / "same.so"))) == []


def test_an_entry_point_changed_without_its_signature_does_not_compile(sources, tmp_path):
    # the prototype and the definition agree (the compiler is content) but abi.c's signature is stale
    _edit(sources / "kernels.h", "int portachat_int_dot(void);", "int portachat_int_dot(int on);")
    _edit(
        sources / "int_dot.c",
        "int portachat_int_dot(void) {",
        "int portachat_int_dot(int on) {\n    (void)on;",
    )
    with pytest.raises(RuntimeError, match="portachat_int_dot differs from its signature in abi.c"):
        ck.build(QUICK, out=tmp_path / "stale.so")
    assert not (tmp_path / "stale.so").exists()
