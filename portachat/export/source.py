"""Reading the checkpoint an export starts from, with the checks every export format shares."""

from __future__ import annotations

from pathlib import Path

from portachat.export.errors import ExportError
from portachat.i18n import _
from portachat.model.hf import UnsupportedConfigError, exportable
from portachat.model.model_dir import LoadedModel, load_model_dir
from portachat.model.source import resolve
from portachat.storage.atomic import CheckpointError


def load_exportable(path: str | Path) -> LoadedModel:
    """Our checkpoint at `path` (weights on the CPU), refused with the reason when it is outside the HF mapping."""
    try:
        path = resolve(path).path
    except (CheckpointError, UnsupportedConfigError) as exc:
        raise ExportError(
            _("{error}. Pass one of our checkpoints: a step directory, a stage directory (its `latest` is used) "
              "or RUN/STAGE under PORTACHAT_HOME, e.g. `--model myrun/sft`").format(error=exc)
        ) from exc
    try:
        loaded = load_model_dir(path, device="cpu")
    except (CheckpointError, ValueError) as exc:
        raise ExportError(_("cannot read the checkpoint at {path}: {error}").format(path=path, error=exc)) from exc
    ok, reason = exportable(loaded.model.config)
    if not ok:
        raise ExportError(
            _("{path} cannot be exported: {reason}. It trained with options outside the Hugging Face "
              "families, so no HF or GGUF runtime would compute the same model; serve it with `portachat serve`.")
            .format(path=path, reason=reason)
        )
    return loaded


def check_output_free(output: Path) -> None:
    if output.exists():
        raise ExportError(_("{path} already exists; pass a new --output path or remove the old one first").format(
            path=output))
    if not output.parent.is_dir():
        raise ExportError(_("the parent directory of --output {path} does not exist; create it first").format(
            path=output))
