"""`portachat <command>`: parses flags and calls the library, nothing more.

Every training command also runs as `torchrun --nproc_per_node=N -m portachat train base ...`.
Flags accept both `--device-batch-size` and nanochat's `--device_batch_size` spelling.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

EPILOG = "Docs: README.md. Environment: PORTACHAT_HOME (runs, caches), PORTACHAT_DEVICE, PORTACHAT_DTYPE, PORTACHAT_COMPILE."


def _flag(parser: argparse.ArgumentParser | argparse._ArgumentGroup, name: str, **kwargs) -> None:
    """Add `--some-flag`, also accepting `--some_flag`."""
    names = [name]
    if "-" in name[2:]:
        names.append("--" + name[2:].replace("-", "_"))
    parser.add_argument(*names, **kwargs)


def int_at_least(minimum: int):
    """An argparse type: an integer >= `minimum`, with a message that says so."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


_positive_int = int_at_least(1)
_nonneg_int = int_at_least(0)


# ----------------------------------------------------------------------------------------- doctor


def cmd_doctor(args: argparse.Namespace) -> int:
    from portachat.tools.doctor import run_doctor

    return run_doctor(as_json=args.json, calibrate=args.calibrate)


# ----------------------------------------------------------------------------------------- tokenizer


def cmd_tokenizer_train(args: argparse.Namespace) -> int:
    from portachat.data.sources import open_source
    from portachat.tokenizer import train_tokenizer
    from portachat.train.base import vocab_size_for

    source = open_source(args.data, split="train")
    out = Path(args.output)
    vocab = args.vocab_size or vocab_size_for(source, args.max_chars)
    print(f"[portachat] training a {vocab}-token tokenizer on {source.name} (up to {args.max_chars:,} chars)")
    t0 = time.perf_counter()
    tok = train_tokenizer(source.iter_documents(limit_chars=args.max_chars), vocab_size=vocab, doc_cap=args.doc_cap, verbose=False)
    from portachat.checkpoint.atomic import atomic_directory

    with atomic_directory(out) as tmp:
        tok.save(tmp)
    print(f"[portachat] saved {tok.vocab_size}-token tokenizer to {out} in {time.perf_counter() - t0:.1f}s")
    return 0


def cmd_tokenizer_eval(args: argparse.Namespace) -> int:
    from portachat.data.sources import open_source
    from portachat.tokenizer import Tokenizer, evaluate_tokenizer, format_evaluation

    tok = Tokenizer.load(args.tokenizer)
    source = open_source(args.data, split=args.split)
    texts = list(source.iter_documents(limit_chars=args.max_chars))
    print(format_evaluation(evaluate_tokenizer(tok, texts)))
    return 0


# ----------------------------------------------------------------------------------------- train


def _add_train_flags(p: argparse.ArgumentParser) -> None:
    from portachat.train.loop import TrainConfig
    from portachat.train.optim import OptimConfig

    d, o = TrainConfig(), OptimConfig()
    g = p.add_argument_group("run")
    # `--run` alone is ambiguous under torchrun (its parser prefix-matches --run-path), hence --run-name.
    g.add_argument("--run-name", "--run_name", "--run", dest="run", default="default",
                   help="run name: checkpoints go to <home>/runs/<run>/<stage>/ (default: default)")
    _flag(g, "--runs-root", default=None, help="directory holding runs (default: $PORTACHAT_HOME/runs)")
    _flag(g, "--resume", nargs="?", const="auto", default=None,
          help="continue from this run's latest checkpoint, or from the checkpoint PATH given")
    _flag(g, "--overwrite", action="store_true", help="delete this run's existing checkpoints for the stage and start over")
    _flag(g, "--seed", type=int, default=d.seed, help=f"random seed (default {d.seed})")
    g = p.add_argument_group("device")
    _flag(g, "--device", default=None, help="cpu|cuda|rocm|dcu|npu|xpu|mps (default: auto-detect)")
    _flag(g, "--dtype", default=None, help="bf16|fp16|fp32 compute dtype (default: the device's best; see `portachat doctor`)")
    _flag(g, "--compile", default=None, choices=["0", "1"], help="torch.compile the model (default: per device policy)")
    g = p.add_argument_group("batch and horizon")
    _flag(g, "--device-batch-size", type=_positive_int, default=None, help="rows per device per micro-step (default: 32 on accelerators, 4 on CPU)")
    _flag(g, "--total-batch-size", type=_positive_int, default=None,
          help="tokens per optimizer step; gradient accumulation makes up the difference (default: one micro-step)")
    _flag(g, "--max-seq-len", type=_positive_int, default=None, help="tokens per row (default: 2048 on accelerators, 256 on CPU)")
    _flag(g, "--num-iterations", type=_positive_int, default=None, help="optimizer steps (default: from --target-param-data-ratio)")
    g = p.add_argument_group("optimization")
    _flag(g, "--matrix-lr", type=float, default=o.matrix_lr, help=f"Muon lr for hidden matrices (default {o.matrix_lr})")
    _flag(g, "--embedding-lr", type=float, default=o.embedding_lr, help=f"AdamW lr for embeddings (default {o.embedding_lr})")
    _flag(g, "--unembedding-lr", type=float, default=o.unembedding_lr, help=f"AdamW lr for the LM head (default {o.unembedding_lr})")
    _flag(g, "--scalar-lr", type=float, default=o.scalar_lr, help=f"AdamW lr for norm gains (default {o.scalar_lr})")
    _flag(g, "--weight-decay", type=float, default=o.weight_decay, help="AdamW weight decay (default 0)")
    _flag(g, "--warmup-ratio", type=float, default=d.warmup_ratio, help=f"fraction of steps warming up (default {d.warmup_ratio})")
    _flag(g, "--warmdown-ratio", type=float, default=d.warmdown_ratio, help=f"fraction of steps decaying to the end (default {d.warmdown_ratio})")
    _flag(g, "--final-lr-frac", type=float, default=d.final_lr_frac, help="lr at the end, as a fraction (default 0)")
    _flag(g, "--grad-clip", type=float, default=d.grad_clip, help=f"clip gradient norm; 0 = off (default {d.grad_clip})")
    _flag(g, "--max-bad-steps", type=_positive_int, default=d.max_bad_steps,
          help=f"abort after this many non-finite steps in a row (default {d.max_bad_steps})")
    g = p.add_argument_group("evaluation, logging, checkpoints")
    _flag(g, "--eval-every", type=_nonneg_int, default=d.eval_every, help=f"validate every N steps; 0 = only at the end (default {d.eval_every})")
    _flag(g, "--eval-tokens", type=_positive_int, default=d.eval_tokens, help=f"validation tokens per evaluation (default {d.eval_tokens})")
    _flag(g, "--sample-every", type=_nonneg_int, default=d.sample_every, help="print samples at evaluations on multiples of N steps; 0 = at every evaluation")
    _flag(g, "--log-every", type=_positive_int, default=d.log_every, help=f"progress line every N steps (default {d.log_every})")
    _flag(g, "--save-every", type=_nonneg_int, default=d.save_every, help="checkpoint every N steps; 0 = only at the end")
    _flag(g, "--keep-last", type=_nonneg_int, default=d.keep_last, help=f"checkpoints kept per stage; 0 = all (default {d.keep_last})")


def _train_config(args: argparse.Namespace, dev) -> object:
    from portachat.train.loop import TrainConfig
    from portachat.train.optim import OptimConfig

    accel = dev.type != "cpu"
    return TrainConfig(
        run=args.run,
        runs_root=args.runs_root,
        device_batch_size=args.device_batch_size or (32 if accel else 4),
        total_batch_size=args.total_batch_size,
        max_seq_len=args.max_seq_len or (2048 if accel else 256),
        warmup_ratio=args.warmup_ratio,
        warmdown_ratio=args.warmdown_ratio,
        final_lr_frac=args.final_lr_frac,
        grad_clip=args.grad_clip,
        eval_every=args.eval_every,
        eval_tokens=args.eval_tokens,
        sample_every=args.sample_every,
        save_every=args.save_every,
        keep_last=args.keep_last,
        log_every=args.log_every,
        seed=args.seed,
        max_bad_steps=args.max_bad_steps,
        optim=OptimConfig(
            matrix_lr=args.matrix_lr,
            embedding_lr=args.embedding_lr,
            unembedding_lr=args.unembedding_lr,
            scalar_lr=args.scalar_lr,
            weight_decay=args.weight_decay,
        ),
    )


def _device_from_args(args: argparse.Namespace):
    from portachat.device import get_device

    compile_flag = None if args.compile is None else args.compile == "1"
    return get_device(kind=args.device, dtype=args.dtype, compile=compile_flag)


def cmd_train_base(args: argparse.Namespace) -> int:
    from portachat.device import destroy_distributed, dist_env
    from portachat.train.base import BaseOptions, run_base

    dev = _device_from_args(args)
    opts = BaseOptions(
        data=args.data,
        tokenizer=args.tokenizer,
        vocab_size=args.vocab_size,
        tokenizer_max_chars=args.tokenizer_max_chars,
        depth=args.depth if args.depth is not None else (20 if dev.type != "cpu" else 4),
        target_param_data_ratio=args.target_param_data_ratio,
        num_iterations=args.num_iterations,
        resume=args.resume,
        overwrite=args.overwrite,
        train=_train_config(args, dev),
    )
    try:
        result = run_base(opts, dev=dev)
    finally:
        destroy_distributed()
    if result.final_checkpoint is not None and dist_env().is_main:
        print(f"[portachat] done: {result.steps} steps, validation bits/byte {result.val_bpb:.4f}")
        print(f"[portachat] model: {result.final_checkpoint}")
    return 0


# ----------------------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="portachat",
        description="Train and serve your own small ChatGPT on any accelerator (NVIDIA, AMD, Hygon DCU, Ascend NPU, Intel XPU, Apple, CPU).",
        epilog=EPILOG,
    )
    parser.add_argument("--debug", action="store_true", help="show full tracebacks instead of a diagnosis")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("doctor", help="check the environment and print a report (exit 1 if something is wrong)",
                       description="Environment report: versions, devices, dtype/compile/attention/collective choices and "
                                   "why, live probes (matmul TFLOPS, transfer bandwidth, all-reduce under torchrun), and "
                                   "known-bad setups with their fixes. Exit code 0 = healthy, 1 = something is wrong.")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--calibrate", action="store_true", help="measure peak matmul FLOPS (cached) for devices not in the table")
    p.set_defaults(func=cmd_doctor)

    p = sub.add_parser("tokenizer", help="train or evaluate the BPE tokenizer")
    tsub = p.add_subparsers(dest="action", metavar="ACTION")
    tsub.required = True
    t = tsub.add_parser("train", help="train a byte-level BPE tokenizer on text data",
                        description="Train a GPT-4-style byte-level BPE tokenizer (with the chat special tokens) on a "
                                    "file or directory of .parquet/.txt/.jsonl, or the synthetic curriculum.")
    _flag(t, "--data", default=None, help="training text (default: built-in synthetic curriculum)")
    _flag(t, "--output", required=True, help="directory to write tokenizer.json and tokenizer_config.json to")
    _flag(t, "--vocab-size", type=_positive_int, default=None, help="vocabulary size (default: sized from the data, 512..32768)")
    _flag(t, "--max-chars", type=_positive_int, default=2_000_000_000, help="train on at most this many characters")
    _flag(t, "--doc-cap", type=_positive_int, default=10_000, help="crop each document to this many characters")
    t.set_defaults(func=cmd_tokenizer_train)
    t = tsub.add_parser("eval", help="bytes per token and encode speed on held-out text")
    _flag(t, "--tokenizer", required=True, help="tokenizer directory (or a checkpoint directory)")
    _flag(t, "--data", default=None, help="text to evaluate on (default: synthetic curriculum)")
    _flag(t, "--split", default="val", choices=["train", "val"], help="which split of --data (default: val, held out)")
    _flag(t, "--max-chars", type=_positive_int, default=10_000_000, help="evaluate on at most this many characters")
    t.set_defaults(func=cmd_tokenizer_eval)

    p = sub.add_parser("train", help="training stages (base pretraining)")
    tsub = p.add_subparsers(dest="stage", metavar="STAGE")
    tsub.required = True
    t = tsub.add_parser("base", help="pretrain a GPT on raw text", epilog=EPILOG,
                        description="Pretrain a GPT from raw text. Checkpoints are Hugging Face model directories under "
                                    "<home>/runs/<run>/base/step_<N>/. Runs under torchrun for multiple devices.")
    g = t.add_argument_group("data and model")
    _flag(g, "--data", default=None, help="file or directory of .parquet/.txt/.jsonl (default: built-in synthetic curriculum)")
    _flag(g, "--tokenizer", default=None, help="existing tokenizer directory (default: train one on --data)")
    _flag(g, "--vocab-size", type=_positive_int, default=None, help="vocabulary size when training the tokenizer (default: sized from the data)")
    _flag(g, "--tokenizer-max-chars", type=_positive_int, default=2_000_000_000, help="characters to train the tokenizer on")
    _flag(g, "--depth", type=int, default=None, help="transformer layers; width, heads and horizon follow (default: 20 on accelerators, 4 on CPU)")
    _flag(g, "--target-param-data-ratio", type=float, default=20.0, help="training tokens per parameter when --num-iterations is not given (default 20)")
    _add_train_flags(t)
    t.set_defaults(func=cmd_train_base)
    return parser


def _report_error(exc: BaseException, debug: bool) -> int:
    from portachat.tools.diagnose import diagnose, format_diagnosis

    if debug:
        traceback.print_exc()
    diagnosis = diagnose(exc)
    if diagnosis is not None:
        print(format_diagnosis(diagnosis), file=sys.stderr)
    else:
        print(f"portachat: error: {exc}", file=sys.stderr)
    if not debug:
        print("(run with --debug for the full traceback)", file=sys.stderr)
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    debug = args.debug or os.environ.get("PORTACHAT_DEBUG") == "1"
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt as exc:
        print(f"\nportachat: interrupted{': ' + str(exc) if str(exc) else ''}", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the top-level handler turns errors into a diagnosis
        return _report_error(exc, debug)


if __name__ == "__main__":
    raise SystemExit(main())
