"""`portachat estimate memory`: device memory for training and serving, counted from the shapes."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, replace

from portachat.commands.common import EPILOG, flag, positive_int, usage_error
from portachat.i18n import _


def model_config_from_args(args: argparse.Namespace):
    """(GPTConfig, name): the --hf-config's sizes (named by its path) or our --depth model (named by the estimator)."""
    from portachat.model import GPTConfig  # deferred: loads torch
    from portachat.model.estimate import load_hf_config  # deferred: loads torch
    from portachat.model.hf import sizes_config  # deferred: loads torch

    if args.hf_config is not None:
        from portachat.model.estimate import gguf_hf_config  # deferred: loads torch
        from portachat.model.gguf import is_gguf  # deferred: loads torch

        config = gguf_hf_config(args.hf_config) if is_gguf(args.hf_config) else load_hf_config(args.hf_config)
        return sizes_config(config), str(args.hf_config)
    return GPTConfig.from_depth(args.depth, args.vocab_size, max_seq_len=args.seq_len), None


def cmd_estimate_memory(args: argparse.Namespace) -> int:
    from portachat.model import ConfigError  # deferred: loads torch
    from portachat.model.estimate import (  # deferred: loads torch
        TrainingSetup,
        estimate_kv_cache,
        estimate_training,
        format_estimate,
    )

    if args.serve:
        return cmd_estimate_serving(args)
    try:
        cfg, name = model_config_from_args(args)
        setup = TrainingSetup(args.batch_size, args.seq_len, args.dtype, args.optimizer,
                              args.activation_checkpointing, args.devices, args.parallel)
        data = None
        if args.data:
            setup, data = setup_from_data(args, setup)
        elif args.tokens_per_batch:
            setup.batch_size, setup.seq_len = max(1, args.tokens_per_batch // args.seq_len), args.seq_len
        train = estimate_training(cfg, setup, name)
        if data is not None:
            train["data"] = data
        serve = estimate_kv_cache(cfg, args.kv_batch_size, args.kv_context or args.seq_len, args.kv_dtype, name=name)
    except (ValueError, ConfigError) as e:
        return usage_error(e)
    measured = None
    if args.measure:
        if args.hf_config is not None or args.devices > 1:
            return usage_error(_("--measure runs our --depth model on this one device; drop --hf-config / --devices"))
        measured = measure(args)
    if args.json:
        print(json.dumps({"training": train, "serving": serve, "measured_peak_bytes": measured}, indent=2))
    else:
        print(format_estimate(train, serve))
        if measured is not None:
            print("\n" + _("measured peak of two real training steps on this device: {mib} MiB "
                            "(estimate / measured = {ratio})").format(
                mib=f"{measured / 2**20:,.1f}", ratio=f"{train['peak_bytes'] / measured:.2f}"))
    return 0


def setup_from_data(args: argparse.Namespace, setup):
    """The micro-batch the data really makes: rows padded to its longest conversation's bucket (the
    device's: --device), or the --tokens-per-batch budget's worth; supervised positions from its masks."""
    from portachat.data.chat_data import load_conversations  # deferred: loads torch
    from portachat.data.chat_loader import data_lengths  # deferred: loads torch
    from portachat.device.shapes import pad_bucket, row_bucket  # deferred: loads torch
    from portachat.model.estimate import chat_renderer  # deferred: loads torch

    source = args.tokenizer or args.hf_config
    if source is None:
        raise ValueError(_("--data needs the tokenizer that renders it: pass --tokenizer (a model directory, "
                           "a tokenizer directory or a .gguf) or --hf-config with a model directory"))
    lengths = data_lengths(load_conversations(args.data), chat_renderer(source), args.seq_len)
    bucket = pad_bucket
    if args.device is not None:
        from portachat.device import get_device  # deferred: loads torch

        dev = get_device(kind=args.device)
        bucket = row_bucket(dev.type, dev.compile)
    rows, width, supervised = lengths.micro_batch(args.batch_size, args.seq_len, bucket, args.tokens_per_batch)
    data = {**asdict(lengths), "batch_size": args.batch_size, "max_seq_len": args.seq_len,
            "tokens_per_batch": args.tokens_per_batch}
    return replace(setup, batch_size=rows, seq_len=width, supervised_tokens=supervised), data


def cmd_estimate_serving(args: argparse.Namespace) -> int:
    from portachat.model import ConfigError  # deferred: loads torch
    from portachat.model.serve_memory import estimate_serving, format_serving  # deferred: loads torch

    device_bytes = device_type = None
    if not args.no_device:
        from portachat.device import get_device  # deferred: loads torch

        device = get_device(kind=args.device)
        device_type = device.type  # what the engine holds there beyond weights and KV (packed copies on a CPU)
        device_bytes = device.memory().total
    if args.device_memory_gb is not None:
        device_bytes = int(args.device_memory_gb * 2**30)
    try:
        cfg, name = model_config_from_args(args)
        serve = estimate_serving(cfg, args.tensor_parallel_size, args.kv_dtype, args.kv_batch_size,
                                 args.kv_context or args.seq_len, device_bytes, device_type=device_type,
                                 step_tokens=args.max_num_batched_tokens, name=name)  # fmt: skip
    except (ValueError, ConfigError) as e:
        return usage_error(e)
    print(json.dumps(serve, indent=2) if args.json else format_serving(serve))
    return 0


def measure(args: argparse.Namespace) -> int:
    from portachat.device import get_device  # deferred: loads torch
    from portachat.model import GPTConfig  # deferred: loads torch
    from portachat.train.batch_size import measure_training_peak  # deferred: loads torch

    dev = get_device(kind=args.device, dtype=args.dtype)
    dev.set_current()
    cfg = GPTConfig.from_depth(args.depth, args.vocab_size, max_seq_len=args.seq_len)
    return measure_training_peak(cfg, args.batch_size, args.seq_len, dev, args.activation_checkpointing)


def register(sub) -> None:
    p = sub.add_parser("estimate", help=_("estimate device memory for training and serving"),
                       description=_("Estimates, counted from the model's shapes (no device needed)."), epilog=EPILOG)
    what = p.add_subparsers(dest="what", metavar="memory", required=True)
    m = what.add_parser(
        "memory", epilog=EPILOG,
        help=_("parameters, gradients, optimizer states, activations, logits and KV cache per device"),
        description=_("Per-device memory of a training step (parameters, gradients, Muon/AdamW states, "
                    "activations with and without --activation-checkpointing, logits, optimizer temporaries) "
                    "and of serving (weights + KV cache). For our --depth, or any Hugging Face config "
                    "(--hf-config DIR_OR_CONFIG_JSON), on --devices N with --parallel ddp|fsdp2."))
    src = m.add_mutually_exclusive_group()
    flag(src, "--depth", type=positive_int, default=4, help=_("portachat model depth (default 4)"))
    flag(src, "--hf-config", default=None, help=_("a Hugging Face model directory, its config.json, or a .gguf file"))
    flag(m, "--vocab-size", type=positive_int, default=32768, help=_("vocabulary for --depth models (default 32768)"))
    m.add_argument("--device-batch-size", "--device_batch_size", "--batch-size", dest="batch_size", type=positive_int,
                   default=4, help=_("sequences per device per micro-step (default 4)"))
    m.add_argument("--max-seq-len", "--max_seq_len", "--seq-len", dest="seq_len", type=positive_int, default=2048,
                   help=_("tokens per sequence (default 2048)"))
    flag(m, "--dtype", choices=("bf16", "fp16", "fp32"), default="bf16", help=_("compute dtype (default bf16)"))
    flag(m, "--optimizer", choices=("muon", "adamw"), default="muon",
         help=_("muon: Muon for layer matrices + AdamW for the rest, as portachat trains (default); adamw: AdamW for all"))
    flag(m, "--activation-checkpointing", action="store_true", help=_("recompute each block in backward"))
    flag(m, "--devices", type=positive_int, default=1, help=_("number of devices (default 1)"))
    flag(m, "--parallel", choices=("ddp", "fsdp2"), default="ddp", help=_("data parallelism across devices (default ddp)"))
    flag(m, "--kv-batch-size", type=positive_int, default=8, help=_("concurrent sequences when serving (default 8)"))
    flag(m, "--kv-context", type=positive_int, default=None, help=_("context per sequence when serving (default --seq-len)"))
    flag(m, "--kv-dtype", choices=("bf16", "fp16", "fp32", "int8", "fp8"), default="bf16",
         help=_("serving KV-cache dtype (default bf16); weights in the same dtype, or bf16 beside an int8/fp8 cache "
              "(which stores one fp32 scale per token and kv head)"))
    flag(m, "--serve", action="store_true",
         help=_("serving only, per device: weights, KV cache per token, and what fits beside them on the device"))
    m.add_argument("--tensor-parallel-size", "--tensor_parallel_size", "-tp", type=positive_int, default=1,
                   help=_("with --serve: devices the model is split over (default 1)"))
    flag(m, "--device-memory-gb", type=float, default=None,
         help=_("with --serve: memory per device in GiB (default: the device layer's total for --device)"))
    flag(m, "--no-device", action="store_true",
         help=_("with --serve: do not look at this machine's device (its memory, and what its engine holds "
                "beyond weights and KV cache, such as a CPU's packed weight copies)"))
    flag(m, "--max-num-batched-tokens", type=positive_int, default=1024,
         help=_("with --serve: tokens per forward step, as serve's flag of that name (default 1024); "
                "sizes the step's transient activations"))
    flag(m, "--data", action="append", default=None,
         help=_("chat data to train on (jsonl/parquet files or directories, repeat to mix): size the micro-batch "
                "by its real lengths, padded to its longest conversation, instead of --max-seq-len"))
    flag(m, "--tokenizer", default=None,
         help=_("with --data: what renders it, a model directory, a tokenizer directory or a .gguf (default: "
                "--hf-config)"))
    flag(m, "--tokens-per-batch", type=positive_int, default=None,
         help=_("micro-batches drawn by this token budget (train's flag of that name) instead of "
                "--device-batch-size rows"))
    flag(m, "--measure", action="store_true",
         help=_("also run two real training steps of the --depth model on this device and print the measured peak"))
    flag(m, "--device", default=None, help=_("device for --measure and --serve: cpu|cuda|rocm|dcu|npu|xpu|mps (default: auto)"))
    flag(m, "--json", action="store_true", help=_("print JSON instead of a table"))
    m.set_defaults(func=cmd_estimate_memory)
