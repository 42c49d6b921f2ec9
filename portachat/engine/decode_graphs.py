"""Decode steps replayed from device graphs (vLLM's CUDA graphs, through the device layer).

A decode step of a small model is bound by the host launching its kernels; a captured graph
launches them all at once. A graph replays fixed shapes at fixed addresses, so a decode-only step
is padded to a bucket: the batch up to the next batch size in `batch_buckets`, each row's block
table up to the next multiple of LENGTH_STEP tokens. The step's inputs are copied into one static
buffer; padded rows write their keys and values into a scratch block that the block manager never
hands out and attend to that one slot. Every (batch, blocks) bucket is captured when the engine
starts (`capture_all`), largest first so the shared pool is sized once, and never while serving:
another engine of the same process may be mid-step then. Without a capturer the same padded step
runs eagerly (how the CPU tests check it).
Mixed and prefill steps, and batches beyond the largest bucket, take the runner's eager path.
"""

from __future__ import annotations

import bisect
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from portachat.device.device import Device
from portachat.device.fast_paths import Verdict, check
from portachat.device.graphs import CapturedGraph, GraphCapturer
from portachat.engine.scheduler import ScheduledSeq
from portachat.engine.step_inputs import StepInputs
from portachat.i18n import _
from portachat.ops.fast_path import Check, enabled

LENGTH_STEP = 256  # tokens: context buckets (a longer gather costs little next to a new capture)
MAX_GRAPH_BATCH = 256  # larger decode batches are bound by the device, not by launches


def batch_buckets(max_num_seqs: int, cap: int = MAX_GRAPH_BATCH) -> list[int]:
    """Padded batch sizes: powers of two below max_num_seqs, then max_num_seqs itself (capped)."""
    top = min(max_num_seqs, cap)
    buckets = [1 << i for i in range(top.bit_length()) if 1 << i < top]
    return buckets + [top]


def padded_blocks(context: int, block_size: int, max_blocks: int) -> int:
    """Block-table width for a step whose longest row holds `context` tokens: a multiple of
    LENGTH_STEP tokens, the step doubling whenever the context passes 8 steps, so that long contexts
    need few graphs and padding stays under an eighth of the context."""
    step = max(1, LENGTH_STEP // block_size)
    need = -(-context // block_size)
    while need > 8 * step:
        step *= 2
    return min(-(-need // step) * step, max_blocks)


def block_buckets(block_size: int, max_blocks: int) -> list[int]:
    """Every block-table width `padded_blocks` can return for this model length, ascending."""
    widths: set[int] = set()
    tokens = 1
    while True:
        width = padded_blocks(tokens, block_size, max_blocks)
        widths.add(width)
        if width >= max_blocks:
            return sorted(widths)
        tokens = width * block_size + 1  # the first context that needs a wider table


@dataclass
class PaddedDecode:
    """A decode-only step, its inputs already in the static buffer."""

    batch: int  # padded rows
    blocks: int  # padded block-table width
    rows: torch.Tensor  # [S] rows whose logits are sampled, in the scheduler's order


class DecodeGraphs:
    def __init__(
        self,
        forward: Callable[[StepInputs], torch.Tensor],
        block_size: int,
        scratch_block: int,
        max_num_seqs: int,
        max_model_len: int,
        vocab_size: int,
        device: torch.device,
        capturer: GraphCapturer | None,
        capture_now: bool = True,
        max_batch: int = MAX_GRAPH_BATCH,
    ) -> None:
        """`capture_now`: capture every bucket here (False: the start-up profile captures one).
        `max_batch`: the largest bucket (the profile pads up to every running sequence)."""
        self.forward = forward
        self.block_size = block_size
        self.scratch_block = scratch_block
        self.buckets = batch_buckets(max_num_seqs, max_batch)
        self.max_blocks = -(-max_model_len // block_size)
        self.device = device
        self.capturer = capturer
        biggest = self.buckets[-1]
        # ids, positions, slots, context lengths, block tables, then the sampled rows
        self.buffer = torch.zeros(biggest * (5 + self.max_blocks), dtype=torch.long, device=device)
        # Every graph writes its logits here: outputs held per graph would keep their memory in the pool.
        self.logits = torch.zeros(biggest, vocab_size, dtype=torch.float32, device=device)
        self.graphs: dict[tuple[int, int], CapturedGraph] = {}
        self.active = True  # False after a failed capture: the runner's eager path from then on
        if capturer is not None and not graphs_proven(device):  # its self-test failed: eager, said once
            self.capturer, self.active = None, False
        if capture_now:
            self.capture_all()

    def all_buckets(self) -> list[tuple[int, int]]:
        """Every (batch, blocks) shape a decode step can be padded to, largest first."""
        widths = block_buckets(self.block_size, self.max_blocks)
        return [(b, w) for b in reversed(self.buckets) for w in reversed(widths)]

    def capture_all(self) -> None:
        """Capture every bucket now (engine start-up), so serving never captures. A failure leaves
        the engine eager, loudly; running out of memory is the caller's to report."""
        if self.capturer is None:
            return
        for key in self.all_buckets():
            if key not in self.graphs and not self.capture(*key):
                return

    def capture(self, batch: int, blocks: int) -> bool:
        """Capture one bucket over padding rows only (they touch nothing but the scratch block)."""
        if self.capturer is None:  # graphs failed their self-test here
            return False
        self.fill_padding(batch, blocks)
        try:
            with torch.inference_mode():  # as the runner's forward replays it: no autograd records
                self.graphs[(batch, blocks)] = self.capturer.capture(lambda: self._padded_forward(batch, blocks))
        except torch.OutOfMemoryError:
            raise
        except Exception as exc:  # capture is an optimisation: fall back to eager, loudly
            warnings.warn(_("decode graph capture failed ({error}); continuing eager").format(
                error=f"{type(exc).__name__}: {exc}"), stacklevel=2)
            self.active = False
            self.graphs.clear()
            return False
        return True

    def fill_padding(self, batch: int, blocks: int) -> None:
        """Lay the static buffer out as a step of `batch` padding rows with `blocks`-wide tables."""
        scratch = self.scratch_block
        payload = [0] * batch + [0] * batch + [scratch * self.block_size] * batch + [1] * batch
        payload += [scratch] * (batch * blocks)
        with torch.inference_mode():
            self.buffer[: len(payload)].copy_(torch.tensor(payload))

    def profile(self, batch: int, blocks: int) -> None:
        """One eager padded step of this shape (the start-up memory profile runs the largest)."""
        self.fill_padding(batch, blocks)
        with torch.inference_mode():
            self._padded_forward(batch, blocks)

    @property
    def replays(self) -> bool:
        """Whether steps replay captured graphs (not eager padding, and no capture has failed)."""
        return self.active and self.capturer is not None

    def fits(self, batch: list[ScheduledSeq]) -> bool:
        return self.active and len(batch) <= self.buckets[-1] and all(s.num_rows == 1 for s in batch)

    def prepare(self, batch: list[ScheduledSeq]) -> PaddedDecode:
        """Copy a decode-only step's inputs, padded to its bucket, into the static buffer."""
        bs, scratch = self.block_size, self.scratch_block
        n = len(batch)
        size = self.buckets[bisect.bisect_left(self.buckets, n)]
        blocks = padded_blocks(max(s.start + 1 for s in batch), bs, self.max_blocks)
        pad = size - n
        tables: list[int] = []
        for s in batch:
            table = s.seq.block_table[:blocks]
            tables += table + [scratch] * (blocks - len(table))
        payload = (
            [s.seq.token_ids[s.start] for s in batch] + [0] * pad
            + [s.start for s in batch] + [0] * pad
            + [s.seq.block_table[s.start // bs] * bs + s.start % bs for s in batch] + [scratch * bs] * pad
            + [s.start + 1 for s in batch] + [1] * pad  # a padded row sees one key: its own scratch slot
            + tables + [scratch] * (blocks * pad)
        )  # fmt: skip
        rows = [i for i, s in enumerate(batch) if s.samples]
        with torch.inference_mode():  # the buffer may be an inference tensor (engine built under it)
            self.buffer[: len(payload) + len(rows)].copy_(torch.tensor(payload + rows), non_blocking=True)
        return PaddedDecode(size, blocks, self.buffer[len(payload) : len(payload) + len(rows)])

    def run(self, step: PaddedDecode) -> torch.Tensor:
        """fp32 logits [S, V] of the sampled rows (a fresh tensor: the next step overwrites `self.logits`)."""
        key = (step.batch, step.blocks)
        graph = self.graphs.get(key) if self.replays else None
        if graph is not None:
            graph.replay()
        else:  # no capturer, a failed start-up capture, or (a bug) a bucket capture_all missed: eager
            self._padded_forward(*key)
        return self.logits.index_select(0, step.rows)

    def _padded_forward(self, batch: int, blocks: int) -> None:
        """The step over the static buffer laid out for this bucket, logits into `self.logits[:batch]`.
        Slots and masks are computed on the device from the block tables, inside the captured graph."""
        ids, positions, slots, context, tables = torch.split(
            self.buffer[: batch * (4 + blocks)], [batch, batch, batch, batch, batch * blocks]
        )
        length = blocks * self.block_size
        within = torch.arange(self.block_size, device=self.device)
        slot_index = (tables.view(batch, blocks, 1) * self.block_size + within).view(batch, length)
        mask = torch.arange(length, device=self.device)[None, :] < context[:, None]
        every_row = torch.arange(batch, device=self.device)
        inp = StepInputs(ids, positions, slots, every_row, batch, slot_index, mask[:, None, None, :], [])
        self.logits[:batch].copy_(self.forward(inp))


def check_graph_replay(dev: Device) -> Verdict:
    """Decode graphs' self-test: a small step (a product, a softmax, a reduction, an in-place write, as a
    decode step has) captured once, then replayed over three new inputs copied into its static buffer,
    beside the same step run eagerly. A replay that raises, or reads stale inputs, keeps the engine eager."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 64, generator=g).to(dev.torch_device, dev.dtype)
    inputs = [torch.randn(8, 64, generator=g).to(dev.torch_device, dev.dtype) for _ in range(3)]
    x = torch.zeros(8, 64, device=dev.torch_device, dtype=dev.dtype)
    out = torch.zeros(8, 64, device=dev.torch_device, dtype=torch.float32)

    def step() -> torch.Tensor:
        out.copy_(torch.softmax((x @ w).float(), dim=-1) * 2 + x.float().sum(-1, keepdim=True))
        return out

    def replayed() -> list[torch.Tensor]:
        with torch.inference_mode():
            graph = GraphCapturer(dev.type).capture(step)
            results = []
            for inp in inputs:
                x.copy_(inp)
                results.append(graph.replay().clone())
            dev.synchronize()
            return results

    def eager() -> list[torch.Tensor]:
        results = []
        for inp in inputs:
            x.copy_(inp)
            results.append(step().clone())
        return results

    return check("decode_graphs", replayed, eager, dev.dtype)


GRAPH_CHECKS: dict[str, Check] = {"decode_graphs": check_graph_replay}


def graphs_proven(device: torch.device) -> bool:
    """Whether decode graphs passed their self-test on this device (run at the first engine start)."""
    return enabled("decode_graphs", device, check_graph_replay)
