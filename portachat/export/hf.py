"""`portachat export hf`: a serving directory for transformers / vLLM / vllm-ascend.

The same HF layout as our checkpoints, written by the same writer (model_dir.save_model_files),
minus everything only training needs: weights in bf16 or fp16 (config.json's torch_dtype says
which), no trainer_state/, and a portachat.json that keeps only what the loader checks (tokenizer
fingerprint) plus where the export came from. generation_config.json keeps the checkpoint's
sampling defaults, so transformers and vLLM sample as `portachat serve` does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from portachat.device.dtypes import DTYPES
from portachat.export.errors import ExportError
from portachat.export.source import check_output_free, load_exportable
from portachat.i18n import _
from portachat.model.hf import FAMILIES
from portachat.model.hf_dir import read_json
from portachat.model.model_dir import save_model_files
from portachat.storage.atomic import CheckpointError, atomic_directory

# Serving widths only: an fp32 export doubles the files for no serving gain.
HF_DTYPES = {name: DTYPES[name] for name in ("bf16", "fp16")}


@dataclass
class HFExport:
    path: Path
    dtype: str
    architecture: str
    weight_bytes: int


def export_hf(model_path: str | Path, output: str | Path, dtype: str = "bf16") -> HFExport:
    """Write the serving directory for the checkpoint at `model_path` to `output` (atomically)."""
    if dtype not in HF_DTYPES:
        raise ExportError(_("--dtype {dtype!r} is not valid for export hf; valid values: {valid}").format(
            dtype=dtype, valid=", ".join(HF_DTYPES)))
    output = Path(output).expanduser()
    check_output_free(output)
    loaded = load_exportable(model_path)
    model, torch_dtype = loaded.model, HF_DTYPES[dtype]
    # Provenance only: no metrics, data position or training config (save_model_files adds the
    # tokenizer fingerprint and model config the loader checks).
    meta = {"exported_from": str(loaded.path), "stage": loaded.meta.get("stage"), "step": loaded.meta.get("step")}
    try:
        generation = read_json(loaded.path / "generation_config.json", required=False)
    except CheckpointError as exc:
        raise ExportError(_("cannot read the checkpoint at {path}: {error}").format(path=loaded.path, error=exc)) from exc
    with atomic_directory(output) as tmp:
        save_model_files(tmp, model, loaded.tokenizer, meta, generation_defaults=generation, dtype=torch_dtype)
    return HFExport(
        path=output,
        dtype=dtype,
        architecture=FAMILIES[model.config.architecture][0],
        weight_bytes=sum(p.numel() for p in model.parameters()) * torch_dtype.itemsize,  # a tied table once
    )
