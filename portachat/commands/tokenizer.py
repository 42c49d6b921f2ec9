"""`portachat tokenizer train|eval`."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from portachat.commands.common import flag, positive_int
from portachat.i18n import _


def cmd_tokenizer_train(args: argparse.Namespace) -> int:
    from portachat.data.sources import open_source  # deferred: loads torch
    from portachat.tokenizer import train_tokenizer  # deferred: loads torch
    from portachat.train.base import vocab_size_for  # deferred: loads torch

    source = open_source(args.data, split="train")
    out = Path(args.output)
    vocab = args.vocab_size or vocab_size_for(source, args.max_chars)
    print("[portachat] " + _("training a {vocab}-token tokenizer on {source} (up to {chars} chars)").format(
        vocab=vocab, source=source.name, chars=f"{args.max_chars:,}"))
    t0 = time.perf_counter()
    tok = train_tokenizer(source.iter_documents(limit_chars=args.max_chars), vocab_size=vocab, doc_cap=args.doc_cap, verbose=False)
    from portachat.storage.atomic import atomic_directory  # deferred: loads torch

    with atomic_directory(out) as tmp:
        tok.save(tmp)
    print("[portachat] " + _("saved {vocab}-token tokenizer to {path} in {seconds}s").format(
        vocab=tok.vocab_size, path=out, seconds=f"{time.perf_counter() - t0:.1f}"))
    return 0


def cmd_tokenizer_eval(args: argparse.Namespace) -> int:
    from portachat.data.sources import open_source  # deferred: loads torch
    from portachat.tokenizer import Tokenizer, evaluate_tokenizer, format_evaluation  # deferred: loads torch

    tok = Tokenizer.load(args.tokenizer)
    source = open_source(args.data, split=args.split)
    texts = list(source.iter_documents(limit_chars=args.max_chars))
    print(format_evaluation(evaluate_tokenizer(tok, texts)))
    return 0


def register(sub) -> None:
    p = sub.add_parser("tokenizer", help=_("train or evaluate the BPE tokenizer"))
    tsub = p.add_subparsers(dest="action", metavar="ACTION")
    tsub.required = True
    t = tsub.add_parser("train", help=_("train a byte-level BPE tokenizer on text data"),
                        description=_("Train a GPT-4-style byte-level BPE tokenizer (with the chat special tokens) on a "
                                    "file or directory of .parquet/.txt/.jsonl, or the synthetic curriculum."))
    flag(t, "--data", default=None, help=_("training text (default: built-in synthetic curriculum)"))
    flag(t, "--output", required=True, help=_("directory to write tokenizer.json and tokenizer_config.json to"))
    flag(t, "--vocab-size", type=positive_int, default=None, help=_("vocabulary size (default: sized from the data, 512..32768)"))
    flag(t, "--max-chars", type=positive_int, default=2_000_000_000, help=_("train on at most this many characters"))
    flag(t, "--doc-cap", type=positive_int, default=10_000, help=_("crop each document to this many characters"))
    t.set_defaults(func=cmd_tokenizer_train)
    t = tsub.add_parser("eval", help=_("bytes per token and encode speed on held-out text"))
    flag(t, "--tokenizer", required=True, help=_("tokenizer directory (or a checkpoint directory)"))
    flag(t, "--data", default=None, help=_("text to evaluate on (default: synthetic curriculum)"))
    flag(t, "--split", default="val", choices=["train", "val"], help=_("which split of --data (default: val, held out)"))
    flag(t, "--max-chars", type=positive_int, default=10_000_000, help=_("evaluate on at most this many characters"))
    t.set_defaults(func=cmd_tokenizer_eval)
