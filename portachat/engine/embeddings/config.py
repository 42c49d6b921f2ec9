"""How a model turns hidden states into one vector: pooling, normalisation, length limit, and
whether shorter vectors are allowed, read from the sentence-transformers files next to the model
(modules.json, 1_Pooling/config.json, sentence_bert_config.json) or given by flags."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from portachat.engine.embeddings.modes import POOLING_MODES
from portachat.i18n import _
from portachat.model.hf_dir import read_json
from portachat.model.source import st_modules
from portachat.storage.atomic import CheckpointError

# sentence-transformers' Pooling config keys -> our names.
_ST_POOLING = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_lasttoken": "last",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
}
_ST_TRANSFORMER = "sentence_transformers.models.Transformer"
_ST_POOLING_MODULE = "sentence_transformers.models.Pooling"
_ST_NORMALIZE = "sentence_transformers.models.Normalize"


@dataclass(frozen=True)
class PoolingConfig:
    pooling: str  # one of POOLING_MODES
    normalize: bool  # unit-length vectors (then cosine similarity is a dot product)
    max_tokens: int | None = None  # longest input the model was trained on (None: the model's context)
    # Shorter `dimensions` are only meaningful for models trained for them (Matryoshka): None = not
    # allowed, () = any size, else the sizes the model lists.
    matryoshka: tuple[int, ...] | None = None
    lowercase: bool = False  # sentence_bert_config's do_lower_case: texts are lowercased before tokenizing
    source: str = "default"

    def with_pooling(self, pooling: str | None) -> PoolingConfig:
        if pooling is None:
            return self
        if pooling not in POOLING_MODES:
            raise ValueError(_("pooling {pooling} is not one of {modes}").format(
                pooling=repr(pooling), modes=", ".join(POOLING_MODES)))
        return replace(self, pooling=pooling, source=self.source + _(", pooling from --pooling"))


DEFAULT_POOLING = PoolingConfig("mean", True, source="default")


def _matryoshka(config: dict[str, Any]) -> tuple[int, ...] | None:
    # vLLM's convention in config.json: `matryoshka_dimensions: [..]` or `is_matryoshka: true`.
    dims = config.get("matryoshka_dimensions")
    if isinstance(dims, list) and dims and all(isinstance(d, int) and d > 0 for d in dims):
        return tuple(sorted(dims))
    return () if config.get("is_matryoshka") is True else None


def read_pooling_config(directory: str | Path, default_pooling: str = "mean") -> PoolingConfig:
    """The model's PoolingConfig: from its sentence-transformers files when they exist, else
    `default_pooling` with normalised vectors (as OpenAI's embeddings are)."""
    directory = Path(directory)
    config = read_json(directory / "config.json", required=False)
    matryoshka = _matryoshka(config)
    modules = st_modules(directory)
    if modules is None:
        return replace(DEFAULT_POOLING, pooling=default_pooling, matryoshka=matryoshka)
    kinds = [m.get("type") for m in modules]
    unknown = [k for k in kinds if k not in (_ST_TRANSFORMER, _ST_POOLING_MODULE, _ST_NORMALIZE)]
    if unknown:
        raise CheckpointError(_("{path}: sentence-transformers modules {modules} are not supported "
                                "(portachat runs Transformer, Pooling and Normalize)").format(
            path=directory / "modules.json", modules=unknown))
    pooling = default_pooling
    pool_module = next((m for m in modules if m.get("type") == _ST_POOLING_MODULE), None)
    if pool_module is not None:
        file = directory / pool_module.get("path", "") / "config.json"
        pool = read_json(file)
        modes = [name for key, name in _ST_POOLING.items() if pool.get(key)]
        others = [k for k, v in pool.items() if k.startswith("pooling_mode_") and v and k not in _ST_POOLING]
        if len(modes) != 1 or others:
            raise CheckpointError(_("{path}: exactly one of {modes} must be true (got {got}); combined pooling "
                                    "modes are not supported").format(
                path=file, modes=", ".join(_ST_POOLING), got=modes + others))
        pooling = modes[0]
    st = read_json(directory / "sentence_bert_config.json", required=False)
    max_tokens = st.get("max_seq_length")
    return PoolingConfig(pooling, _ST_NORMALIZE in kinds, max_tokens if isinstance(max_tokens, int) else None,
                         matryoshka, st.get("do_lower_case") is True, "sentence-transformers config")
