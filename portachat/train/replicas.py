"""Data parallelism must keep every rank's weights bit-identical: verified at the end of a run, not assumed."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from portachat.i18n import _
from portachat.model import GPT
from portachat.train.accumulation import TrainingError

_INT_OF_SIZE = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's raw bits as integers of the same width (bit-identical tensors give identical sums)."""
    return t.contiguous().view(_INT_OF_SIZE[t.element_size()])


def check_replicas_in_sync(model: GPT, world: int, say: Callable[[str], None]) -> None:
    """Every rank's weights checksummed and compared (collective); raises if any rank differs."""
    with torch.no_grad():  # integer sums of the weights' bit patterns: exact, in any order, and no float64
        local = torch.stack([bits(p.detach()).sum(dtype=torch.int64) for p in model.parameters()])
    gathered = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(gathered, local)
    if not all(torch.equal(gathered[0], g) for g in gathered[1:]):
        raise TrainingError(_("the ranks' weights diverged: data-parallel replicas are out of sync (please report "
                              "this)"))
    say("[portachat] " + _("weights identical on all {world} ranks (checksum {checksum})").format(
        world=world, checksum=gathered[0].sum().item()))
