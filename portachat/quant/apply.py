"""quantize_model: swap a GPT's linear layers (and token table) for weight-only quantized modules.

The device layer decides the backend (portachat/device/quantization.py); this module carries it out
in place and reports bytes before/after, so every caller (serve, chat, generate, eval) prints the
same honest line. Norms stay in the model's dtype: they are a few thousand numbers.
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass, field

import torch
from torch import nn

from portachat.device import get_device
from portachat.device.quantization import BACKEND_ATEN_CPU, BACKEND_TORCHAO, QuantPlan, quantization_plan
from portachat.i18n import _
from portachat.quant.int4 import INT4_N_MULTIPLE, Int4Linear
from portachat.quant.int8 import INT8_K_MULTIPLE, Int8Embedding, Int8Linear


class QuantizationError(RuntimeError):
    """A model that cannot be quantized as asked; the message says why and what to do."""


@dataclass
class QuantReport:
    mode: str
    backend: str
    reason: str
    bytes_before: int
    bytes_after: int
    quantized: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # module name -> why it kept its weights
    warning: str | None = None

    @property
    def ratio(self) -> float:
        return self.bytes_before / max(self.bytes_after, 1)

    def summary(self) -> str:
        line = _(
            "quantize {mode}: {count} modules via {backend} ({reason}); weights {before} MiB -> {after} MiB "
            "({ratio}x smaller)"
        ).format(mode=self.mode, count=len(self.quantized), backend=self.backend, reason=self.reason,
                 before=f"{self.bytes_before / 2**20:.1f}", after=f"{self.bytes_after / 2**20:.1f}",
                 ratio=f"{self.ratio:.2f}")
        if self.skipped:
            line += _("; kept unquantized: {modules}").format(
                modules=", ".join(f"{k} ({v})" for k, v in self.skipped.items()))
        if self.warning:
            line += _("; warning: {warning}").format(warning=self.warning)
        return line


def _plain_tensors(t: torch.Tensor) -> list[torch.Tensor]:
    """The plain tensors holding a tensor's data (torchao's quantized weights are tensor subclasses)."""
    if type(t) not in (torch.Tensor, nn.Parameter) and hasattr(t, "__tensor_flatten__"):
        names, _ = t.__tensor_flatten__()
        return [leaf for name in names for leaf in _plain_tensors(getattr(t, name))]
    return [t]


def weight_bytes(model: nn.Module) -> int:
    """Bytes of parameters and persistent buffers, each storage counted once (tied tables share one)."""
    seen: set[int] = set()
    total = 0
    tensors = list(model.parameters())
    for module in model.modules():
        persistent = set(module._buffers) - module._non_persistent_buffers_set
        tensors += [module._buffers[name] for name in persistent if module._buffers[name] is not None]
    for t in (leaf for tensor in tensors for leaf in _plain_tensors(tensor)):
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key in seen:
            continue
        seen.add(key)
        total += storage.nbytes()
    return total


def model_dtype(model: nn.Module) -> torch.dtype:
    """The dtype a (possibly quantized) model computes in: its norm weights stay unquantized, so the
    first floating-point parameter says it. Use this instead of `model.lm_head.weight.dtype`."""
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    raise QuantizationError(_("the model has no floating-point parameters to read its dtype from"))


def model_device(model: nn.Module) -> torch.device:
    """Where a (possibly quantized) model's weights live; use instead of `embed_tokens.weight.device`."""
    return next(model.parameters()).device


def _set_submodule(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, new)


def _int4_group(in_features: int, preferred: int) -> int | None:
    for g in (preferred, 64, 32):
        if g <= preferred and in_features % g == 0:
            return g
    return None


def _aten_linear(linear: nn.Linear, plan: QuantPlan) -> tuple[nn.Module | None, str]:
    n, k = linear.weight.shape
    if plan.mode == "int8":
        if k % INT8_K_MULTIPLE:
            return None, _("in_features {k} is not a multiple of {multiple}").format(k=k, multiple=INT8_K_MULTIPLE)
        return Int8Linear.from_linear(linear, plan.activation_dtype), ""
    group = _int4_group(k, plan.group_size or 64)
    if group is None:
        return None, _("in_features {k} is not a multiple of {multiple}").format(k=k, multiple=32)
    if n % INT4_N_MULTIPLE:
        return None, _("out_features {n} is not a multiple of {multiple}").format(n=n, multiple=INT4_N_MULTIPLE)
    return Int4Linear.from_linear(linear, group, plan.activation_dtype), ""


# What to install, by the torch installed (scripts/choose_torch.py TORCH_COMPANIONS holds the same range for
# torch < 2.7: the newest torchao needs torch >= 2.7; 0.15/0.16 still import on 2.6 and have the int4 option).
TORCHAO_FOR_OLD_TORCH = "torchao>=0.15,<0.17"
TORCHAO_INT4 = "torchao>=0.15"


def _torchao_install_hint() -> str:
    old = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) < (2, 7)
    return TORCHAO_FOR_OLD_TORCH if old else TORCHAO_INT4


def torchao_quantization():
    """torchao.quantization, or a QuantizationError naming what to install: torchao missing, or one built for
    a newer torch (it fails on import, e.g. an AttributeError on a torch internal it expects)."""
    try:
        import torchao.quantization as quantization  # deferred: optional (portachat[models]), seconds to import
    except (ImportError, AttributeError) as e:
        raise QuantizationError(_(
            "torchao could not be imported with torch {torch} ({error}); install one that pairs with it: "
            "pip install '{spec}' (bash scripts/setup.sh holds that range), or run without --quantize").format(
                torch=torch.__version__, error=f"{type(e).__name__}: {e}", spec=_torchao_install_hint())) from e
    return quantization


def torchao_config(plan: QuantPlan):
    """torchao's config for a plan: per-channel int8, or int4 in tinygemm's tile-packed layout (an option
    older torchao lacks: checked here, so an old one gets a message instead of a TypeError)."""
    quantization = torchao_quantization()
    if plan.mode == "int8":
        return quantization.Int8WeightOnlyConfig()
    config = quantization.Int4WeightOnlyConfig
    if "int4_packing_format" not in inspect.signature(config).parameters:
        version = getattr(sys.modules.get("torchao"), "__version__", "?")
        raise QuantizationError(_(
            "torchao {version} has no int4_packing_format option, which --quantize int4 needs (tinygemm's "
            "tile-packed layout); install a newer one: pip install '{spec}', or use --quantize int8").format(
                version=version, spec=_torchao_install_hint()))
    return config(group_size=plan.group_size or 128, int4_packing_format="tile_packed_to_4d")


def _torchao_quantize(model: nn.Module, names: list[str], plan: QuantPlan) -> None:
    config = torchao_config(plan)
    wanted = set(names)
    model.to(plan.activation_dtype)  # tinygemm takes bf16 activations and scales
    torchao_quantization().quantize_(model, config, filter_fn=lambda module, fqn: fqn in wanted)


@torch.no_grad()
def quantize_model(
    model: nn.Module, mode: str, device=None, plan: QuantPlan | None = None, compiled: bool | None = None
) -> QuantReport:
    """Quantize `model` (a portachat GPT, weights already on `device`) in place; return what changed.

    Every nn.Linear becomes weight-only int8 (per output channel) or int4 (grouped); the token
    table becomes int8 per row (shared with the output head when they are tied, in int8 mode).
    `plan` overrides the device layer's choice (tests use it); otherwise `device` decides
    (`portachat.device.get_device()` when None); `compiled` says whether the caller will run the model
    under torch.compile (default: the device's compile decision). Raises DeviceError where no kernel exists.
    """
    if plan is None:
        if device is None:
            device = get_device()
        plan = quantization_plan(device, mode, compiled)
    elif plan.mode != mode:
        raise QuantizationError(_("the quantization plan is for {plan}, but mode {mode} was asked").format(
            plan=plan.mode, mode=repr(mode)))
    if any(isinstance(m, (Int8Linear, Int4Linear, Int8Embedding)) for m in model.modules()):
        raise QuantizationError(_("the model is already quantized; load it again to quantize it differently"))
    before = weight_bytes(model)
    report = QuantReport(plan.mode, plan.backend, plan.reason, before, before, warning=plan.warning)

    embed = model.get_submodule("model.embed_tokens") if hasattr(model, "model") else None
    head = getattr(model, "lm_head", None)
    tied = embed is not None and head is not None and head.weight is embed.weight
    linears = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear)]

    if plan.backend == BACKEND_ATEN_CPU:
        for name, linear in linears:
            if tied and name == "lm_head" and plan.mode == "int8":
                continue  # shares the embedding's int8 table below
            new, why = _aten_linear(linear, plan)
            if new is None:
                report.skipped[name] = why
                continue
            _set_submodule(model, name, new)
            report.quantized.append(name)
    elif plan.backend == BACKEND_TORCHAO:
        names = [n for n, _ in linears if not (tied and n == "lm_head")]
        _torchao_quantize(model, names, plan)
        report.quantized += names
    else:
        raise QuantizationError(_("unknown quantization backend {backend}").format(backend=repr(plan.backend)))

    if embed is not None:
        qembed = Int8Embedding.from_embedding(embed)
        _set_submodule(model, "model.embed_tokens", qembed)
        report.quantized.append("model.embed_tokens")
        if tied and plan.backend == BACKEND_ATEN_CPU and plan.mode == "int8":  # skipped in the loop above
            if qembed.embedding_dim % INT8_K_MULTIPLE == 0:  # one int8 table serves lookup and output head
                model.lm_head = Int8Linear(qembed.qweight, qembed.scale, plan.activation_dtype)
                report.quantized.append("lm_head")
            else:
                report.skipped["lm_head"] = (
                    f"in_features {qembed.embedding_dim} is not a multiple of {INT8_K_MULTIPLE}"
                )
        elif tied and plan.backend == BACKEND_TORCHAO:
            report.skipped["lm_head"] = "tied to the token table; kept in the model dtype"
    report.bytes_after = weight_bytes(model)
    return report
