"""`portachat tokenizer train|eval`.

What runs. The flags are in commands/tokenizer.py, which `--help` imports without torch."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from portachat.data.sources import open_source
from portachat.i18n import _
from portachat.storage.atomic import atomic_directory
from portachat.tokenizer import Tokenizer, evaluate_tokenizer, format_evaluation, train_tokenizer
from portachat.train.base import vocab_size_for


def cmd_tokenizer_train(args: argparse.Namespace) -> int:
    source = open_source(args.data, split="train")
    out = Path(args.output)
    vocab = args.vocab_size or vocab_size_for(source, args.max_chars)
    print("[portachat] " + _("training a {vocab}-token tokenizer on {source} (up to {chars} chars)").format(
        vocab=vocab, source=source.name, chars=f"{args.max_chars:,}"))
    t0 = time.perf_counter()
    tok = train_tokenizer(source.iter_documents(limit_chars=args.max_chars), vocab_size=vocab, doc_cap=args.doc_cap, verbose=False)

    with atomic_directory(out) as tmp:
        tok.save(tmp)
    print("[portachat] " + _("saved {vocab}-token tokenizer to {path} in {seconds}s").format(
        vocab=tok.vocab_size, path=out, seconds=f"{time.perf_counter() - t0:.1f}"))
    return 0


def cmd_tokenizer_eval(args: argparse.Namespace) -> int:
    tok = Tokenizer.load(args.tokenizer)
    source = open_source(args.data, split=args.split)
    texts = list(source.iter_documents(limit_chars=args.max_chars))
    print(format_evaluation(evaluate_tokenizer(tok, texts)))
    return 0
