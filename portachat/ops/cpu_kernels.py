"""portachat's own CPU kernels (kernels/*.c): small-batch products bound by memory bandwidth
(gemv.c), a layer's decode attention in one call (attention.c), and the layers of a small step in
one call (decode_step.c).

The C sources are compiled for the CPU it runs on (-march=native) by the C compiler the machine has,
once: `scripts/setup.sh` builds it at install time, and a first use builds it if setup did not
(a compiler appeared later, a new CPU). The library lands in a cache directory keyed by the
source, the flags and the CPU's feature flags, written atomically, so concurrent processes and
machines sharing a home directory never load a half-written or foreign build. Where no compiler
works, `library()` is None and callers keep PyTorch's kernels (the tested fallback).

The interface is mirrored here in ctypes (ENTRY_POINTS, WEIGHT_KINDS, _Product, MAX_ROWS) and checked
when the library loads: kernels/abi.c reports the signatures, enum values, struct layout and row
limit as compiled, and a library that differs is not used (PyTorch's kernels run, the reason is
printed once) rather than called through a wrong mirror.

PORTACHAT_CPU_KERNELS=0 turns the kernels off (the PyTorch path is then what runs);
PORTACHAT_CPU_INT_DOT=0 keeps them but multiplies int8/int4 weights in fp32 (see integer_products).
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import torch

from portachat.device.fast_paths import Verdict, check
from portachat.i18n import _
from portachat.ops.fast_path import enabled
from portachat.storage.atomic import atomic_file

KERNELS = Path(__file__).parent / "kernels"
SOURCES = tuple(sorted(KERNELS.glob("*.c")))
HEADERS = tuple(sorted(KERNELS.glob("*.h")))
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")
WEIGHT_KINDS = {"fp32": 0, "bf16": 1, "int8": 2, "int4": 3}
MAX_ROWS = 64  # rows of x per call (the kernel's per-thread output tile); more rows go to PyTorch
# The entry points' signatures, as abi.c spells them (the result's code ':' the arguments'; i int,
# q int64, f float, p pointer, v void): ctypes' restype and argtypes are made from these, and the
# library reports its own. kernels.h has the prototypes with their parameters' names.
ENTRY_POINTS = {
    "portachat_gemv": "i:ipppiiiipiipppiifip",
    "portachat_decode_layers": "i:ppipiipppppqqpppiiiii",
    "portachat_int_dot": "i:v",
    "portachat_set_int_dot": "v:i",
    "portachat_abi": "i:pi",
}
_CTYPES = {"i": ctypes.c_int, "q": ctypes.c_int64, "f": ctypes.c_float, "p": ctypes.c_void_p, "v": None}


def cache_dir() -> Path:
    root = os.environ.get("PORTACHAT_KERNEL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "portachat", "kernels"
    )
    return Path(root)


def _cpu_signature() -> str:
    """The CPU's feature flags (what -march=native compiles for): a build is only reused on a CPU
    that has the same."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def library_path(flags: tuple[str, ...] = FLAGS) -> Path:
    key = hashlib.sha256()
    files = (p.read_bytes() for p in (*SOURCES, *HEADERS))
    for part in (*files, " ".join(flags).encode(), _cpu_signature().encode()):
        key.update(part)
    return cache_dir() / f"kernels-{key.hexdigest()[:16]}.so"


def compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def build(flags: tuple[str, ...] = FLAGS, out: Path | None = None) -> Path:
    """Compile the kernels (if this source/flags/CPU has no build yet); the library's path.
    Raises RuntimeError with the compiler's message where it fails."""
    out = out or library_path(flags)
    if out.exists():
        return out
    cc = compiler()
    if cc is None:
        raise RuntimeError(_("no C compiler found (install gcc, or set CC)"))
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(out) as tmp:  # another process sees no library or the whole one
        command = [cc, *flags, "-o", str(tmp), *map(str, SOURCES), "-lm"]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            message = _("{cc} failed to build the CPU kernels: {error}")
            raise RuntimeError(message.format(cc=cc, error=done.stderr.strip()[-2000:]))
    return out


def _ctypes_of(signature: str) -> tuple[type | None, list[type]]:
    result, arguments = signature.split(":")
    return _CTYPES[result], [_CTYPES[code] for code in arguments if code != "v"]


def expected_abi() -> dict[str, str]:
    """What this module relies on, in the names and text kernels/abi.c reports them."""
    want = dict(ENTRY_POINTS)
    want |= {f"weight.{kind}": str(value) for kind, value in WEIGHT_KINDS.items()}
    want["max_rows"] = str(MAX_ROWS)
    want["sizeof.Product"] = str(ctypes.sizeof(_Product))
    want |= {f"Product.{name}": str(getattr(_Product, name).offset) for name, _type in _Product._fields_}
    return want


def reported_abi(lib: ctypes.CDLL) -> dict[str, str]:
    """The interface as the library was compiled (portachat_abi); {} for a library without one."""
    try:
        report = lib.portachat_abi
    except AttributeError:
        return {}
    report.restype, report.argtypes = _ctypes_of("i:pi")  # how to ask never changes: no mirror to check
    size = report(None, 0) + 1
    if size < 2:  # snprintf failed: nothing reported, so nothing agrees
        return {}
    text = ctypes.create_string_buffer(size)
    report(text, size)
    return dict(item.split("=", 1) for item in text.value.decode().split(";") if item)


def abi_differences(lib: ctypes.CDLL) -> list[str]:
    """Each name whose value differs between the library and this module, as "name: library X,
    portachat Y"; [] where they agree."""
    got = reported_abi(lib)
    return [f"{name}: library {got.get(name, '-')}, portachat {value}"
            for name, value in expected_abi().items() if got.get(name) != value]  # fmt: skip


def load(path: Path) -> ctypes.CDLL:
    """The library at path with its entry points typed; RuntimeError (saying what differs) where its
    interface is not the one this module mirrors."""
    lib = ctypes.CDLL(str(path))
    differences = abi_differences(lib)
    if differences:
        message = _("{path} does not have the interface portachat expects ({differences})")
        raise RuntimeError(message.format(path=path, differences="; ".join(differences)))
    for name, signature in ENTRY_POINTS.items():
        function = getattr(lib, name)
        function.restype, function.argtypes = _ctypes_of(signature)
    lib.portachat_set_int_dot(os.environ.get("PORTACHAT_CPU_INT_DOT", "1") != "0")
    return lib


@lru_cache(maxsize=1)
def library() -> ctypes.CDLL | None:
    """The built kernels, or None where they are turned off, cannot be built here, or failed their
    self-test against PyTorch's products (check_library; the verdict is cached per build, the reason
    printed once)."""
    if os.environ.get("PORTACHAT_CPU_KERNELS", "1") == "0":
        return None
    try:
        path = build()
        lib = load(path)
    except (OSError, RuntimeError) as e:
        reason = _("[portachat] CPU kernels unavailable, using PyTorch's: {reason}").format(reason=e)
        print(reason, file=sys.stderr)
        return None
    return lib if enabled("cpu_kernels", "cpu", lambda _dev: check_library(lib), build=lambda: path.name) else None


def check_library(lib: ctypes.CDLL) -> Verdict:
    """The kernels' products (fp32 and bf16 weights; the fused norm, SwiGLU input and residual) beside
    PyTorch's on small shapes: fp32 weights within fp32's tolerance, bf16 weights within bf16's (a CPU
    with bf16 dot products rounds x to bf16 as well)."""
    g = torch.Generator().manual_seed(0)
    n, k, eps = 40, 96, 1e-6
    x, res = torch.randn(5, k, generator=g), torch.randn(5, n, generator=g)
    w, bias = torch.randn(n, k, generator=g) * 0.1, torch.randn(n, generator=g)
    scale, gate_up = torch.rand(k, generator=g) + 0.5, torch.randn(5, 2 * k, generator=g)
    wb = w.bfloat16()
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    act = torch.nn.functional.silu(gate_up[:, :k]) * gate_up[:, k:]

    def fp32_ours() -> list[torch.Tensor]:
        f = SmallBatchLinear(lib, "fp32", w, n, k, in_scale=scale, bias=bias)
        return [f(x), f(x, norm_eps=eps)]

    def bf16_ours() -> list[torch.Tensor]:
        f = SmallBatchLinear(lib, "bf16", wb, n, k)
        return [f(x), f(gate_up, swiglu=True, residual=res)]

    linear = torch.nn.functional.linear
    verdicts = (
        check("cpu_kernels", fp32_ours, lambda: [linear(x * scale, w, bias), linear(normed * scale, w, bias)],
              torch.float32),
        check("cpu_kernels", bf16_ours, lambda: [linear(x, wb.float()), linear(act, wb.float()) + res],
              torch.bfloat16),
    )
    return next((v for v in verdicts if not v.ok), verdicts[0])


def integer_products(lib: ctypes.CDLL) -> bool:
    """Whether this build multiplies int8/int4 weights as integers with x rounded to int8 per 32
    inputs (int_dot.c, AVX2; ~2x faster, perplexity +0.3% on SmolLM2 int8), rather than widening
    every weight to fp32. PORTACHAT_CPU_INT_DOT=0 or set_integer_products(lib, False) turn it off."""
    return bool(lib.portachat_int_dot())


def set_integer_products(lib: ctypes.CDLL, on: bool) -> bool:
    """Turns the integer products on or off for products built from now on (routing is decided when
    a product is built); returns whether they were on."""
    was = integer_products(lib)
    lib.portachat_set_int_dot(bool(on))
    return was


def _int4_packed(codes: torch.Tensor, block: int) -> torch.Tensor:
    """codes [N, K] (0..15) in the int4 layout gemv.c describes for packing blocks of `block` rows."""
    n, k = codes.shape
    full, half = n // block * block, block // 2
    c = codes[:full].view(-1, block, k)
    parts = [(c[:, :half] | c[:, half:] << 4).transpose(1, 2).reshape(-1)]  # per block: [K, block / 2]
    tail = codes[full:]
    parts.append((tail[0::2] | tail[1::2] << 4).t().reshape(-1))  # the partial block: two rows a byte
    return torch.cat(parts).to(torch.uint8)


@lru_cache(maxsize=1)
def int4_packing_block() -> int | None:
    """Rows per block of PyTorch's CPU int4 layout here (torch._convert_weight_to_int4pack_for_cpu):
    it follows the CPU's vector width (32 for AVX2, 64 for AVX-512), and the kernels read both; None
    for a layout they do not know (int4 products then stay PyTorch's)."""
    codes = torch.randint(0, 16, (112, 64), generator=torch.Generator().manual_seed(0), dtype=torch.int32)
    packed = torch._convert_weight_to_int4pack_for_cpu(codes, 1).view(torch.uint8).flatten()
    for block in (32, 64):  # 112 rows: full blocks and a partial one in either layout
        if torch.equal(packed, _int4_packed(codes, block)):
            return block
    return None


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


class SmallBatchLinear:
    """x [M, K] (fp32 or bf16) -> y [M, N] in x's dtype (or `out_dtype`) = (x * in_scale) @ W.T + bias,
    W given in one of WEIGHT_KINDS (int4 in PyTorch's packed layout, which int4_packing_block must
    know: else ValueError). Holds references to its tensors (the kernel reads them in place: no
    copy). More than MAX_ROWS rows run MAX_ROWS at a time (each call reads the weight again)."""

    def __init__(self, lib: ctypes.CDLL, kind: str, weight: torch.Tensor, n: int, k: int,
                 scale: torch.Tensor | None = None, zero: torch.Tensor | None = None, group: int = 0,
                 in_scale: torch.Tensor | None = None, bias: torch.Tensor | None = None) -> None:  # fmt: skip
        fp32 = [None if t is None else t.detach().float().contiguous() for t in (scale, zero, in_scale, bias)]
        self.scale, self.zero, self.in_scale, self.bias = fp32
        self.weight = weight.detach().contiguous()
        self.kind, self.n, self.k, self.group = WEIGHT_KINDS[kind], n, k, group
        self.block = int4_packing_block() if kind == "int4" else 0
        if self.block is None:
            raise ValueError("PyTorch's int4 packing on this CPU is in a layout the kernels do not read")
        self._fn = lib.portachat_gemv
        self._fixed = (_ptr(self.scale), _ptr(self.zero), group, n, k, self.block)

    def __call__(self, x: torch.Tensor, out_dtype: torch.dtype | None = None, *, norm_eps: float | None = None,
                 in_scale: torch.Tensor | None = None, swiglu: bool = False,
                 residual: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        """The product of x's rows; the keywords fuse what surrounds it in a decode layer:
        norm_eps: an RMS norm of each row first (in_scale, fp32, is then its weight, else the one
        given at construction); swiglu: x is [gate | up] and the input is silu(gate) * up;
        residual: added to the output (in the output's dtype, x's unless out_dtype)."""
        x = x.contiguous()
        out_dtype = out_dtype or x.dtype
        y = torch.empty(x.size(0), self.n, dtype=out_dtype)
        scale = self.in_scale if in_scale is None else in_scale
        residual = None if residual is None else residual.contiguous()
        for start in range(0, x.size(0), MAX_ROWS):
            rows = slice(start, start + MAX_ROWS)
            part, out = x[rows], y[rows]
            rc = self._fn(self.kind, self.weight.data_ptr(), *self._fixed, part.data_ptr(),
                          x.dtype == torch.bfloat16, part.size(0), _ptr(scale), _ptr(self.bias), out.data_ptr(),
                          out_dtype == torch.bfloat16, torch.get_num_threads(),
                          -1.0 if norm_eps is None else norm_eps, swiglu,
                          None if residual is None else residual[rows].data_ptr())  # fmt: skip
            if rc != 0:
                raise MemoryError("portachat_gemv could not allocate its input buffer")
        return y


class _Product(ctypes.Structure):  # decode_step.c's Product (a Weight, then in_scale and bias)
    # its fields' offsets and size are checked against the compiled struct (expected_abi)
    _fields_ = [("kind", ctypes.c_int), ("w", ctypes.c_void_p), ("scale", ctypes.c_void_p),
                ("zero", ctypes.c_void_p), ("group", ctypes.c_int), ("n", ctypes.c_int), ("k", ctypes.c_int),
                ("block", ctypes.c_int), ("in_scale", ctypes.c_void_p), ("bias", ctypes.c_void_p)]  # fmt: skip


class DecodeLayers:
    """The layers of a small step in one call (kernels/decode_step.c): per layer `products` holds
    (qkv, o, gate_up, down) SmallBatchLinears, qkv and gate_up with their norm's weight as in_scale;
    `qkv_bias` (fp32, or None) per layer is added after the normalised product; `norm_eps` per layer
    (input, post-attention). Holds references to every tensor the C side reads. Each layer is
    model/layer_ops.py's contract (tests/engine/test_layer_contract.py holds it to the model's forward)."""

    def __init__(self, lib: ctypes.CDLL, products: list[tuple[SmallBatchLinear, ...]],
                 qkv_bias: list[torch.Tensor | None], norm_eps: list[tuple[float, float]]) -> None:  # fmt: skip
        self._fn = lib.portachat_decode_layers
        self._keep = [b.float().contiguous() for b in qkv_bias if b is not None]
        array = (_Product * (4 * len(products)))()
        biases = iter(self._keep)
        for i, (layer, bias) in enumerate(zip(products, qkv_bias, strict=True)):
            for j, f in enumerate(layer):
                extra = next(biases) if j == 0 and bias is not None else f.bias
                array[4 * i + j] = _Product(f.kind, f.weight.data_ptr(), _ptr(f.scale), _ptr(f.zero), f.group,
                                            f.n, f.k, f.block, _ptr(f.in_scale), _ptr(extra))  # fmt: skip
        self._products = products  # the C side reads their tensors: they live as long as this
        self._layers, self._array = len(products), array
        self._eps = (ctypes.c_float * (2 * len(norm_eps)))(*(e for pair in norm_eps for e in pair))

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor,
                 k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor, slots: torch.Tensor,
                 mask: torch.Tensor | None, heads: int, kv_heads: int, head_dim: int) -> None:  # fmt: skip
        """Runs every layer over x [M, C] (its residual stream, updated in place). The caches:
        [layers, H_kv, num_slots, D] fp32, contiguous; slots/mask as decode_attention takes them."""
        m, length = slots.shape
        rc = self._fn(ctypes.addressof(self._array), ctypes.addressof(self._eps), self._layers, x.data_ptr(),
                      x.dtype == torch.bfloat16, m, positions.data_ptr(), cos.data_ptr(), sin_signed.data_ptr(),
                      k_cache.data_ptr(), v_cache.data_ptr(), k_cache.stride(0), k_cache.size(2),
                      slot_mapping.data_ptr(), slots.data_ptr(), _ptr(mask), length, heads, kv_heads, head_dim,
                      torch.get_num_threads())  # fmt: skip
        if rc != 0:
            raise RuntimeError(f"portachat_decode_layers failed (head_dim {head_dim} > 512, or out of memory)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m portachat.ops.cpu_kernels",
        description=_("Build portachat's CPU kernels for this machine (scripts/setup.sh runs this)."),
    )
    parser.add_argument("--build", action="store_true", help=_("compile now (skipped when a build exists)"))
    args = parser.parse_args(argv)
    if not args.build:
        parser.print_help()
        return 0
    if library_path().exists():
        return 0  # quiet when up to date, as setup is
    try:
        path = build()
        load(path)  # the interface check too: setup says so now rather than the first use
    except (OSError, RuntimeError) as e:
        message = _("[setup] CPU kernels not built ({reason}); portachat will use PyTorch's kernels")
        print(message.format(reason=e), file=sys.stderr)
        return 0  # optional: a machine without a compiler still installs and runs
    print(_("[setup] built portachat's CPU kernels for this CPU: {path}").format(path=path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
