"""`portachat export hf`: a serving directory for transformers / vLLM / vllm-ascend.

The same HF layout as our checkpoints, minus everything only training needs: weights in bf16 or
fp16 (config.json's torch_dtype says which), no trainer_state/, and a portachat.json that keeps
only what the loader checks (tokenizer fingerprint) plus where the export came from.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors.torch import save_file

from portachat.device.dtypes import DTYPES
from portachat.export.errors import ExportError
from portachat.export.source import check_output_free, load_exportable
from portachat.i18n import _
from portachat.model.hf import generation_config, to_hf_config
from portachat.model.model_dir import FORMAT_VERSION, META, WEIGHTS
from portachat.storage.atomic import atomic_directory

# Serving widths only: an fp32 export doubles the files for no serving gain.
HF_DTYPES = {name: DTYPES[name] for name in ("bf16", "fp16")}


@dataclass
class HFExport:
    path: Path
    dtype: str
    architecture: str
    weight_bytes: int


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def export_hf(model_path: str | Path, output: str | Path, dtype: str = "bf16") -> HFExport:
    """Write the serving directory for the checkpoint at `model_path` to `output` (atomically)."""
    if dtype not in HF_DTYPES:
        raise ExportError(_("--dtype {dtype!r} is not valid for export hf; valid values: {valid}").format(
            dtype=dtype, valid=", ".join(HF_DTYPES)))
    output = Path(output).expanduser()
    check_output_free(output)
    loaded = load_exportable(model_path)
    model, tokenizer, cfg = loaded.model, loaded.tokenizer, loaded.model.config
    torch_dtype = HF_DTYPES[dtype]
    state = {k: v.detach().to(torch_dtype).contiguous() for k, v in model.state_dict().items()}
    if cfg.tie_embeddings:
        state.pop("lm_head.weight", None)  # transformers ties it back from embed_tokens
    hf_config = to_hf_config(cfg, bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id, dtype=torch_dtype)
    meta = {
        "format_version": FORMAT_VERSION,
        "exported_from": str(loaded.path),
        "stage": loaded.meta.get("stage"),
        "step": loaded.meta.get("step"),
        "tokenizer_fingerprint": tokenizer.fingerprint(),
        "model_config": cfg.to_dict(),
        "exportable": True,
    }
    with atomic_directory(output) as tmp:
        save_file(state, str(tmp / WEIGHTS), metadata={"format": "pt"})
        _write_json(tmp / "config.json", hf_config)
        _write_json(tmp / "generation_config.json", generation_config(bos_id=tokenizer.bos_id, eos_id=tokenizer.end_ids))
        tokenizer.save(tmp, model_max_length=cfg.max_seq_len)
        _write_json(tmp / META, meta)
    return HFExport(
        path=output,
        dtype=dtype,
        architecture=hf_config["architectures"][0],
        weight_bytes=sum(t.numel() * t.element_size() for t in state.values()),
    )
