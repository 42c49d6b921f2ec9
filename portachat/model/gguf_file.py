"""The GGUF container: metadata and tensor table parsed with `struct`, tensor bytes memory-mapped.

gguf.GGUFReader builds a numpy view per metadata item, which for a 50k-token vocabulary and its
merges costs seconds; parsing the same header with `struct` takes a fraction of that. The layout
(ggml's docs/gguf.md): magic "GGUF", version, tensor count, metadata count, the metadata
key/values, the tensor table (name, dims fastest-first, ggml type, offset), then the data section at
the next `general.alignment` boundary.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from portachat.i18n import _

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# GGUF metadata value types -> struct format (8 = string and 9 = array are read by hand).
_SCALAR = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_NUMPY = {
    0: "<u1",
    1: "<i1",
    2: "<u2",
    3: "<i2",
    4: "<u4",
    5: "<i4",
    6: "<f4",
    7: "?",
    10: "<u8",
    11: "<i8",
    12: "<f8",
}


class GGUFFormatError(ValueError):
    """Bytes that do not parse as a GGUF file."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # torch order (slowest dimension first)
    ggml_type: int
    start: int  # absolute byte offset in the file
    nbytes: int


class _Cursor:
    def __init__(self, buf: Any, pos: int = 0) -> None:
        self.buf, self.pos = buf, pos

    def unpack(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.unpack("<Q")
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        return bytes(raw).decode("utf-8", errors="replace")

    def value(self, kind: int) -> Any:
        if kind in _SCALAR:
            return self.unpack(_SCALAR[kind])
        if kind == 8:
            return self.string()
        if kind == 9:
            item_kind, count = self.unpack("<I"), self.unpack("<Q")
            if item_kind in _NUMPY:  # numbers: one frombuffer instead of `count` unpacks
                dtype = np.dtype(_NUMPY[item_kind])
                values = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos).tolist()
                self.pos += count * dtype.itemsize
                return values
            return [self.value(item_kind) for _ in range(count)]
        raise GGUFFormatError(_("unknown metadata value type {kind}").format(kind=kind))


def _nbytes(ggml_type: int, shape: tuple[int, ...]) -> int:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType  # deferred: gguf files only

    try:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError):
        raise GGUFFormatError(_("unknown ggml tensor type id {type}").format(type=ggml_type)) from None
    return int(np.prod(shape, dtype=np.int64)) // block * size


class GGUFFile:
    """An open GGUF: `metadata` (key -> value, arrays as lists), `tensors` (name -> TensorInfo)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        with self.path.open("rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            self.metadata, self.tensors = self._parse()
        except (struct.error, UnicodeDecodeError, OverflowError, ValueError) as e:
            self._map.close()
            if isinstance(e, GGUFFormatError):
                raise
            raise GGUFFormatError(_("truncated or damaged header ({error})").format(error=e)) from e

    def _parse(self) -> tuple[dict[str, Any], dict[str, TensorInfo]]:
        if self._map[:4] != GGUF_MAGIC:
            raise GGUFFormatError(_("the file does not start with the GGUF magic bytes"))
        c = _Cursor(self._map, 4)
        version = c.unpack("<I")
        if version not in (2, 3):
            raise GGUFFormatError(
                _("GGUF version {version} is not supported (2 and 3 are; big-endian files are not)").format(
                    version=version)
            )
        n_tensors, n_kv = c.unpack("<Q"), c.unpack("<Q")
        metadata: dict[str, Any] = {}
        for _key in range(n_kv):
            key = c.string()
            metadata[key] = c.value(c.unpack("<I"))
        table = []
        for _tensor in range(n_tensors):
            name = c.string()
            dims = [c.unpack("<Q") for _ in range(c.unpack("<I"))]
            table.append((name, tuple(reversed(dims)), c.unpack("<I"), c.unpack("<Q")))
        alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        data_start = (c.pos + alignment - 1) // alignment * alignment
        tensors = {}
        for name, shape, ggml_type, offset in table:
            info = TensorInfo(name, shape, ggml_type, data_start + offset, _nbytes(ggml_type, shape))
            if info.start + info.nbytes > len(self._map):
                raise GGUFFormatError(_("tensor {name} runs past the end of the file (truncated download?)").format(
                    name=name))
            tensors[name] = info
        return metadata, tensors

    def raw(self, name: str) -> np.ndarray:
        """A tensor's stored bytes, shaped (*rows, bytes per row) as gguf.quants.dequantize expects."""
        info = self.tensors[name]
        data = np.frombuffer(self._map, dtype=np.uint8, count=info.nbytes, offset=info.start)
        rows = info.shape[:-1] if len(info.shape) > 1 else ()
        return data.reshape(*rows, -1)

    def close(self) -> None:
        self._map.close()

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc: object) -> None:
        # Views returned by raw() may still reference the map; then it stays open until they are freed.
        try:
            self.close()
        except BufferError:
            pass
