"""A student made from its teacher: the same family, vocabulary and width, fewer layers.

`--student-depth N` keeps N of the teacher's L layers, evenly spaced from the first to the last
(round(i·(L-1)/(N-1)) for i < N; the first layer alone for N = 1), with the embeddings, final norm
and output head as they are. Evenly spaced rather than the first N: the first layer is the one that
reads the embeddings and the last is the one the output head was trained to read, so keeping both
leaves the student's residual stream closest to what each kept block and the head expect
(DistilBERT's student is every other teacher layer for the same reason); the first N layers alone
would feed the head a stream it never saw. Pruning by measured importance is `portachat prune`'s.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from portachat.i18n import _
from portachat.model import GPT
from portachat.train.accumulation import TrainingError


def kept_layers(teacher_depth: int, depth: int) -> list[int]:
    """Which teacher layers a student of `depth` layers keeps, in order."""
    if not 1 <= depth < teacher_depth:
        raise TrainingError(_("--student-depth {depth}: the teacher has {layers} layers; pick 1 to {most}").format(
            depth=depth, layers=teacher_depth, most=teacher_depth - 1))
    if depth == 1:
        return [0]
    return [round(i * (teacher_depth - 1) / (depth - 1)) for i in range(depth)]


@torch.no_grad()
def student_from_teacher(teacher: GPT, depth: int) -> GPT:
    """A new GPT of `depth` layers holding copies of the kept teacher layers (same device and dtype)."""
    keep = kept_layers(teacher.config.n_layer, depth)
    weight = teacher.lm_head.weight
    student = GPT(replace(teacher.config, n_layer=depth)).to(device=weight.device, dtype=weight.dtype)
    state = {}
    for name, tensor in teacher.state_dict().items():
        if name.startswith("model.layers."):
            index, rest = name.removeprefix("model.layers.").split(".", 1)
            if int(index) not in keep:
                continue
            name = f"model.layers.{keep.index(int(index))}.{rest}"
        state[name] = tensor.clone()
    student.load_state_dict(state, strict=True)
    student.train(teacher.training)
    return student
