"""`portachat tokenizer train|eval`."""

from __future__ import annotations

from portachat.commands.common import flag, later, positive_int
from portachat.i18n import _


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
    t.set_defaults(func=later("tokenizer", "cmd_tokenizer_train"))
    t = tsub.add_parser("eval", help=_("bytes per token and encode speed on held-out text"))
    flag(t, "--tokenizer", required=True, help=_("tokenizer directory (or a checkpoint directory)"))
    flag(t, "--data", default=None, help=_("text to evaluate on (default: synthetic curriculum)"))
    flag(t, "--split", default="val", choices=["train", "val"], help=_("which split of --data (default: val, held out)"))
    flag(t, "--max-chars", type=positive_int, default=10_000_000, help=_("evaluate on at most this many characters"))
    t.set_defaults(func=later("tokenizer", "cmd_tokenizer_eval"))
