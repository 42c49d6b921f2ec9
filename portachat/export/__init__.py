"""Exports of our checkpoints: an HF serving directory (`export hf`) and a GGUF file (`export gguf`)."""

from portachat.export.errors import ExportError
from portachat.export.gguf import GGUF_TYPES, GGUFExport, export_gguf
from portachat.export.hf import HF_DTYPES, HFExport, export_hf

__all__ = ["GGUF_TYPES", "HF_DTYPES", "ExportError", "GGUFExport", "HFExport", "export_gguf", "export_hf"]
