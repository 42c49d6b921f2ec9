"""torch.compile with an eager way out: a compiler that fails on this machine costs the speed-up, not the run.

torch.compile compiles at the first call, so a backend that cannot generate code for the device (a
Triton build that does not target it, a missing compiler) fails inside the first training step. The
wrapper catches that first failure, says why, and runs the eager model from then on: the failed call is
rerun eagerly, so the step (and its loss) is the one eager training would have taken. Once a compiled
call has succeeded, later errors are the model's own and are raised as they are.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from portachat.i18n import _


class CompileFallback(torch.nn.Module):
    """Calls the compiled module; on its first failure, the eager one for the rest of the run."""

    def __init__(self, eager: torch.nn.Module, backend: str | Callable, say: Callable[[str], None]) -> None:
        super().__init__()
        self.eager = eager
        self.compiled = torch.compile(eager, backend=backend)
        self.say = say
        self.failed: str | None = None  # why compilation was abandoned, once it was
        self._proven = False  # a compiled call has succeeded: errors from now on are not compile errors

    def forward(self, *args, **kwargs):
        if self.failed is not None:
            return self.eager(*args, **kwargs)
        if self._proven:
            return self.compiled(*args, **kwargs)
        try:
            out = self.compiled(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - any compiler failure: the eager model still trains
            self.failed = _reason(exc)
            self.say("[portachat] " + _("torch.compile failed at the first step ({error}); training continues "
                                        "eagerly (set PORTACHAT_COMPILE=0 to skip compiling)").format(
                error=self.failed))
            torch.compiler.reset()  # drop the half-built graphs and their caches
            return self.eager(*args, **kwargs)
        self._proven = True
        return out


def _reason(exc: BaseException) -> str:
    """The compiler's own error, on one line: torch wraps it (BackendCompilerFailed, InductorError)."""
    inner = getattr(exc, "inner_exception", None) or exc
    while inner.__cause__ is not None:
        inner = inner.__cause__
    lines = [line for line in str(inner).splitlines() if line.strip()]
    return f"{type(inner).__name__}: {lines[0].strip() if lines else ''}"


def compile_or_eager(model: torch.nn.Module, backend: str | Callable, say: Callable[[str], None]) -> torch.nn.Module:
    """The model the trainer steps: compiled with `backend`, falling back to `model` if compiling fails."""
    return CompileFallback(model, backend, say)
