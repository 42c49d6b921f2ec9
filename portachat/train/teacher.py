"""The teacher of a distillation run: what scores each micro-batch's supervised positions.

In process (`InProcessTeacher`): the model runs the batch's rows once (no gradients, eval mode, in
the dtype it was loaded in). For the whole vocabulary it gives its final hidden states at the
supervised positions and its head, and the loss computes its log-probabilities a chunk at a time next
to the student's (distill_loss.py); for its top k (distill_loss.py says how the rest is handled) it
finds them a chunk of positions at a time. Its fp32 [tokens x vocabulary] logits never exist whole.

Remote (`RemoteTeacher`, `--teacher http://HOST:PORT`): a `portachat serve` or vLLM server, or any
OpenAI-compatible server that returns prompt log-probabilities in vLLM's `prompt_logprobs` layout (`POST /v1/completions` with the row's token ids as
the prompt, `prompt_logprobs: k`): for each prompt position, the top k next tokens by id with their
log-probabilities. A server gives them at temperature 1 and only the top k, so a remote teacher needs
--top-k and --temperature 1. The vocabulary check asks the server's `/tokenize` for the ids of a probe
text and compares them with the student's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from portachat.data.batch import Batch
from portachat.engine.speculative.vocabulary import vocabulary_difference
from portachat.i18n import _
from portachat.model import GPT
from portachat.model.loss import loss_chunk_size
from portachat.train.accumulation import TrainingError
from portachat.train.distill_loss import DistillLoss, TeacherTargets


def supervised_indices(batch: Batch) -> torch.Tensor:
    """Flat indices of the batch's supervised targets (found on the host by Batch.to when it could)."""
    if batch.supervised is not None:
        return batch.supervised
    return (batch.targets.reshape(-1) >= 0).nonzero().squeeze(1)


@dataclass
class InProcessTeacher:
    model: GPT  # eval mode, on the training device
    name: str

    def __post_init__(self) -> None:
        self.model.eval().requires_grad_(False)
        self.chunk = loss_chunk_size(self.model.config.vocab_size)

    @torch.no_grad()
    def targets(self, batch: Batch, loss: DistillLoss) -> TeacherTargets:
        """The whole vocabulary: the final hidden states at the supervised positions and the head (the loss
        runs it a chunk at a time). Top k: the k log-probabilities and ids, found a chunk at a time."""
        hidden = self.model.hidden_states(batch.inputs, batch.positions)
        picked = hidden.reshape(-1, hidden.size(-1)).index_select(0, supervised_indices(batch))
        whole = TeacherTargets(hidden=picked, head=self.model.lm_head)
        if loss.top_k is None or loss.top_k >= self.model.config.vocab_size:
            return whole
        pieces = [whole.rows(s, s + self.chunk).resolved(loss.temperature, loss.top_k)
                  for s in range(0, picked.size(0), self.chunk)] or [whole.resolved(loss.temperature, loss.top_k)]
        return TeacherTargets(torch.cat([p.logprobs for p in pieces]), torch.cat([p.ids for p in pieces]))


def check_shared_vocabulary(teacher: GPT, teacher_tokenizer: Any, teacher_name: str, student: GPT,
                            student_tokenizer: Any, student_name: str) -> None:  # fmt: skip
    """Refuse a student that does not speak the teacher's token ids, naming both models and sizes."""
    found = vocabulary_difference(teacher, teacher_tokenizer, student, student_tokenizer)
    if found is None:
        return
    if found.token_id is not None:
        detail = _("token {id} is {teacher_spelling} in the teacher and {student_spelling} in the student").format(
            id=found.token_id, teacher_spelling=repr(found.spellings[0]), student_spelling=repr(found.spellings[1]))
    else:
        detail = _("their tokenizers hold {teacher_tokens} and {student_tokens} tokens").format(
            teacher_tokens=found.tokens[0], student_tokens=found.tokens[1])
    raise TrainingError(_(
        "the teacher {teacher} (vocabulary of {teacher_vocab}) and the student {student} (vocabulary of {student_vocab}) "
        "do not "
        "share a vocabulary ({detail}). Distillation compares their next-token distributions token id by token "
        "id: pick a student of the teacher's family and tokenizer, or build one from the teacher with "
        "--student-depth N.").format(teacher=teacher_name, teacher_vocab=found.rows[0], student=student_name,
                                     student_vocab=found.rows[1], detail=detail))


# Latin, digits, punctuation, code, CJK and emoji: two tokenizers that split all of it alike are one vocabulary
# for every practical purpose (a remote server's vocabulary cannot be read token by token).
PROBE_TEXT = ("The quick brown fox jumps over 13 lazy dogs; naïve café, déjà vu! def f(x):\n    return x ** 2  # ok\n"
              "你好，世界。机器学习模型的词表必须一致。こんにちは 😀 <|im_start|> 3.14159 {\"key\": [1, 2]}")


def is_remote(spec: str) -> bool:
    return spec.startswith(("http://", "https://"))


class RemoteTeacher:
    """A teacher behind an OpenAI-compatible server that returns `prompt_logprobs` (vLLM's layout)."""

    def __init__(self, url: str, model: str | None = None, api_key: str | None = None, timeout_s: float = 600.0) -> None:
        import httpx  # deferred: optional (portachat[serve]); only a remote teacher needs it

        self.url, self.name = url.rstrip("/").removesuffix("/v1"), url
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(timeout=timeout_s, headers=headers)
        self.model = model or self._first_model()

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            reply = self.client.post(self.url + path, json=body)
        except Exception as exc:  # connection refused, DNS, timeout: say where and what
            raise TrainingError(_("the remote teacher {url} did not answer {path}: {error}").format(
                url=self.name, path=path, error=exc)) from exc
        if reply.status_code != 200:
            raise TrainingError(_("the remote teacher {url} answered {path} with HTTP {status}: {body}").format(
                url=self.name, path=path, status=reply.status_code, body=reply.text[:300]))
        return reply.json()

    def _first_model(self) -> str:
        try:
            models = self.client.get(self.url + "/v1/models").json()["data"]
            return str(models[0]["id"])
        except Exception as exc:
            raise TrainingError(_("the remote teacher {url} lists no model at /v1/models ({error}); name it with "
                                  "--teacher-model").format(url=self.name, error=exc)) from exc

    def check_vocabulary(self, student_tokenizer: Any, student_vocab: int, student_name: str) -> None:
        """The server's ids for PROBE_TEXT must be the student's."""
        theirs = self._post("/tokenize", {"model": self.model, "prompt": PROBE_TEXT, "add_special_tokens": False})
        ours = list(student_tokenizer.encode(PROBE_TEXT))
        tokens = list(theirs.get("tokens", []))
        if tokens != ours:
            first = next((i for i, (a, b) in enumerate(zip(tokens, ours, strict=False)) if a != b), min(len(tokens), len(ours)))
            raise TrainingError(_(
                "the remote teacher {teacher} and the student {student} (vocabulary of {student_vocab}) do not share a "
                "vocabulary: a probe text is {teacher_n} tokens for the teacher and {student_n} for the student, "
                "first different at token {first}. Distillation compares their next-token distributions token id by "
                "token id: pick a student of the teacher's family and tokenizer.").format(
                    teacher=f"{self.name} ({self.model})", student=student_name, student_vocab=student_vocab,
                    teacher_n=len(tokens), student_n=len(ours), first=first))

    def targets(self, batch: Batch, loss: DistillLoss) -> TeacherTargets:
        if loss.top_k is None or loss.temperature != 1.0:
            raise TrainingError(_("a remote teacher returns its top-k log-probabilities at temperature 1: pass "
                                  "--top-k K and --temperature 1, or run the teacher in this process"))
        k = loss.top_k
        keep = supervised_indices(batch).cpu()
        width = batch.inputs.size(1)
        rows, cols = (keep // width).tolist(), (keep % width).tolist()
        inputs, targets = batch.inputs.cpu(), batch.targets.cpu()
        ids = torch.empty(len(rows), k, dtype=torch.long)
        logprobs = torch.empty(len(rows), k, dtype=torch.float32)
        by_row: dict[int, list[int]] = {}
        for n, r in enumerate(rows):
            by_row.setdefault(r, []).append(n)
        for r, picks in by_row.items():
            last = max(cols[n] for n in picks)
            prompt = inputs[r, : last + 1].tolist() + [int(targets[r, last])]
            reply = self._post("/v1/completions", {"model": self.model, "prompt": prompt, "max_tokens": 1,
                                                   "temperature": 0.0, "prompt_logprobs": k})
            positions = reply["choices"][0].get("prompt_logprobs")
            if not positions or len(positions) != len(prompt):
                raise TrainingError(_("the remote teacher {url} returned no prompt_logprobs for a {n}-token prompt: it "
                                      "must be a server that scores prompts (vLLM does)").format(url=self.name, n=len(prompt)))
            for n in picks:
                top = sorted(_entries(positions[cols[n] + 1]), key=lambda e: -e[1])[:k]
                if len(top) < k:
                    raise TrainingError(_("the remote teacher {url} returned {got} log-probabilities for a position, "
                                          "fewer than --top-k {k}").format(url=self.name, got=len(top), k=k))
                ids[n] = torch.tensor([t for t, _lp in top])
                logprobs[n] = torch.tensor([lp for _t, lp in top])
        device = batch.inputs.device
        return TeacherTargets(logprobs.to(device), ids.to(device))


def _entries(position: dict[str, Any]) -> list[tuple[int, float]]:
    """vLLM's {"<token id>": {"logprob": x, ...}} (or {"<token id>": x}) as (id, logprob) pairs."""
    out = []
    for key, value in position.items():
        lp = value["logprob"] if isinstance(value, dict) else value
        out.append((int(key), float(lp)))
    return out
