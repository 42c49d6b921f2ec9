"""Base pretraining: raw text in, a GPT that continues text out.

Wires the stage-specific parts (data source, tokenizer, model size, horizon) into the shared loop.
"""

from __future__ import annotations

import itertools
import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from tokenizers import Tokenizer as HFTokenizer

from portachat.data.document_source import DocumentSource
from portachat.data.loader import PackedLoader, iter_val_batches
from portachat.data.sources import open_source
from portachat.device import Device, DistEnv
from portachat.eval.bpb import unigram_bpb
from portachat.i18n import _
from portachat.model import GPT, GPTConfig, training_tokens
from portachat.model.model_dir import read_meta
from portachat.storage.atomic import atomic_directory
from portachat.tokenizer import Tokenizer, train_tokenizer
from portachat.tokenizer.bpe import TOKENIZER_FILE
from portachat.train.parallel import share_from_rank0
from portachat.train.stage import begin_stage
from portachat.train.trainer import (
    Stage,
    TrainConfig,
    TrainingError,
    TrainResult,
    resolve_device_batch_size,
    train,
)


@dataclass
class BaseOptions:
    data: str | None = None  # file or directory of .parquet/.txt/.jsonl; None = built-in synthetic curriculum
    tokenizer: str | None = None  # an existing tokenizer directory; None = train one on the data
    vocab_size: int | None = None  # None = sized from the data (see auto_vocab_size)
    tokenizer_max_chars: int = 2_000_000_000
    depth: int = 4
    target_param_data_ratio: float = 20.0  # horizon when --num-iterations is not given (Chinchilla)
    num_iterations: int | None = None
    resume: str | None = None  # "auto" = this run's latest checkpoint, or a checkpoint path
    overwrite: bool = False
    train: TrainConfig = field(default_factory=TrainConfig)


def auto_vocab_size(num_chars: int) -> int:
    """A power of two near chars/256, between 512 and 32768: big vocabularies starve on small data."""
    if num_chars <= 0:
        return 512
    return int(min(32768, max(512, 2 ** round(math.log2(num_chars / 256)))))


def vocab_size_for(source: DocumentSource, max_chars: int) -> int:
    """The automatic vocabulary size for training a tokenizer on (up to `max_chars` of) `source`."""
    return auto_vocab_size(sum(len(doc) for doc in source.iter_documents(limit_chars=max_chars)))


def prepare_tokenizer(opts: BaseOptions, source: DocumentSource, run_path: Path, env: DistEnv, say) -> Tokenizer:
    """Train a tokenizer on the training split into the run (rank 0; the others wait), or reuse the
    run's own when it was trained on the same data with the same settings. The other ranks receive
    it through the process group: no filesystem is assumed to be shared between nodes."""
    tok_dir = run_path / "tokenizer"
    wanted = {"data": source.name, "vocab_size": opts.vocab_size, "max_chars": opts.tokenizer_max_chars}
    stamp = tok_dir / "portachat_tokenizer_source.json"
    if env.is_main:
        reuse = stamp.is_file() and json.loads(stamp.read_text(encoding="utf-8")) == wanted
        if not reuse:
            vocab = opts.vocab_size or vocab_size_for(source, opts.tokenizer_max_chars)
            say("[portachat] " + _("training a {vocab}-token BPE tokenizer on {source} ...").format(
                vocab=vocab, source=source.name))
            t0 = time.perf_counter()
            tok = train_tokenizer(source.iter_documents(limit_chars=opts.tokenizer_max_chars), vocab_size=vocab)
            with atomic_directory(tok_dir) as tmp:
                tok.save(tmp)
                (tmp / stamp.name).write_text(json.dumps(wanted) + "\n", encoding="utf-8")
            say("[portachat] " + _("tokenizer: {vocab} tokens in {seconds}s -> {path}").format(
                vocab=tok.vocab_size, seconds=f"{time.perf_counter() - t0:.1f}", path=tok_dir))
    if not env.is_distributed:
        return Tokenizer.load(tok_dir)
    # A collective with a long timeout: training a tokenizer on a big corpus can outlast the default one.
    text = share_from_rank0((tok_dir / TOKENIZER_FILE).read_text(encoding="utf-8") if env.is_main else None)
    return Tokenizer(HFTokenizer.from_str(text))


def _sample_prompts(val: DocumentSource, n: int = 3) -> list[str]:
    """Openings of the first validation documents: samples then show whether the model writes alike."""
    prompts: list[str] = []
    for doc in val.iter_documents():
        words = doc.strip().split(" ")
        opening = " ".join(words[:4]).strip()
        if opening:
            prompts.append(opening[:60])
        if len(prompts) == n:
            break
    return prompts


def _targets(batches: Iterator[tuple[torch.Tensor, torch.Tensor]]) -> Iterator[torch.Tensor]:
    for _inputs, targets in batches:
        yield targets


def run_base(opts: BaseOptions, dev: Device | None = None, print_fn=print) -> TrainResult:
    """Pretrain (or resume pretraining) and return the final checkpoint."""
    if opts.depth < 1:
        raise TrainingError(_("--depth must be at least 1 (the number of transformer layers), got {depth}").format(
            depth=opts.depth))
    if opts.tokenizer and opts.vocab_size:
        raise TrainingError(_("--vocab-size sizes a tokenizer portachat trains; it cannot apply to --tokenizer DIR"))
    start = begin_stage("base", opts.train, dev, print_fn, resume=opts.resume, overwrite=opts.overwrite)
    dev, env, say, cfg, path, resume_from = start.dev, start.env, start.say, start.cfg, start.path, start.resume_from

    train_src = open_source(opts.data, split="train")
    val_src = open_source(opts.data, split="val")
    say("[portachat] " + _("data: {name} ({train} train units, {val} val units)").format(
        name=train_src.name, train=train_src.num_units, val=val_src.num_units))
    if opts.data is None:
        say("[portachat] " + _("NOTE: no --data given: training on the built-in SYNTHETIC curriculum (offline)."))
    if opts.tokenizer:
        tokenizer = Tokenizer.load(opts.tokenizer)  # checked against the checkpoint's on resume
    elif resume_from:
        tokenizer = Tokenizer.load(resume_from)
    else:
        tokenizer = prepare_tokenizer(opts, train_src, path.parent, env, say)

    model_cfg = GPTConfig.from_depth(opts.depth, vocab_size=tokenizer.vocab_size, max_seq_len=cfg.max_seq_len)
    with torch.device(dev.torch_device):
        model = GPT(model_cfg)
    model.init_weights(seed=cfg.seed)
    cfg = resolve_device_batch_size(cfg, model, dev, env, say)
    saved = read_meta(resume_from) if resume_from is not None else {}
    if opts.num_iterations is not None:
        num_iterations = opts.num_iterations
    elif saved:  # keep the horizon the run was planned with, whatever the batch now
        num_iterations = int(saved["train_config"]["num_iterations"])
    else:
        tokens_per_step = cfg.total_batch_size or cfg.device_batch_size * cfg.max_seq_len * env.world_size
        num_iterations = max(1, training_tokens(model_cfg, opts.target_param_data_ratio) // tokens_per_step)
    cfg = replace(cfg, num_iterations=num_iterations)
    if saved.get("final") and cfg.num_iterations > int(saved["step"]):
        say(
            "[portachat] " + _("note: extending a finished run from step {step} to {iterations}: the "
                               "learning-rate schedule is laid out for the new horizon, so the rate rises again "
                               "after the warmdown.").format(step=saved["step"], iterations=cfg.num_iterations)
        )

    B, T = cfg.device_batch_size, cfg.max_seq_len
    val_tokens_per_batch = B * T * env.world_size
    max_val_batches = max(1, cfg.eval_tokens // val_tokens_per_batch)

    def val_batches(rank: int, world: int):
        return iter_val_batches(val_src, tokenizer, B, T, max_val_batches, stream=rank, num_streams=world)

    data = Stage(
        make_stream=lambda s, n: PackedLoader(train_src, tokenizer, B, T, stream=s, num_streams=n),
        val_batches=val_batches,
        sample_prompts=_sample_prompts(val_src),
        prefetch=2,  # tokenize and pack the next batches while the step computes
    )
    baseline = None
    if env.is_main:
        sample_loader = PackedLoader(train_src, tokenizer, B, T)
        train_targets = _targets(itertools.islice(iter(sample_loader), max(1, 200_000 // (B * T))))
        baseline = unigram_bpb(train_targets, _targets(val_batches(0, 1)), tokenizer.token_bytes())
        say("[portachat] " + _("unigram baseline: {bpb} bits/byte (the model must get well below this)").format(
            bpb=f"{baseline:.4f}"))
    extra = {"data": train_src.name, "unigram_bpb": baseline, "depth": opts.depth}
    return train(model, tokenizer, data, cfg, dev, env, path, resume_from=resume_from, extra_meta=extra, print_fn=print_fn)
