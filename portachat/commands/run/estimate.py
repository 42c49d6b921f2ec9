"""`portachat estimate memory`: device memory for training and serving, counted from the shapes.

What runs. The flags are in commands/estimate.py, which `--help` imports without torch."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, replace

from portachat.commands.common import usage_error
from portachat.data.chat_data import load_conversations
from portachat.data.chat_loader import data_lengths
from portachat.device import get_device
from portachat.device.shapes import pad_bucket, row_bucket
from portachat.i18n import _
from portachat.model import ConfigError, GPTConfig
from portachat.model.estimate import (
    TrainingSetup,
    chat_renderer,
    estimate_kv_cache,
    estimate_training,
    format_estimate,
    gguf_hf_config,
    load_hf_config,
)
from portachat.model.gguf import is_gguf
from portachat.model.hf import sizes_config
from portachat.model.serve_memory import estimate_serving, format_serving
from portachat.train.batch_size import measure_training_peak


def model_config_from_args(args: argparse.Namespace):
    """(GPTConfig, name): the --hf-config's sizes (named by its path) or our --depth model (named by the estimator)."""
    if args.hf_config is not None:
        config = gguf_hf_config(args.hf_config) if is_gguf(args.hf_config) else load_hf_config(args.hf_config)
        return sizes_config(config), str(args.hf_config)
    return GPTConfig.from_depth(args.depth, args.vocab_size, max_seq_len=args.seq_len), None


def cmd_estimate_memory(args: argparse.Namespace) -> int:
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
    source = args.tokenizer or args.hf_config
    if source is None:
        raise ValueError(_("--data needs the tokenizer that renders it: pass --tokenizer (a model directory, "
                           "a tokenizer directory or a .gguf) or --hf-config with a model directory"))
    lengths = data_lengths(load_conversations(args.data), chat_renderer(source), args.seq_len)
    bucket = pad_bucket
    if args.device is not None:
        dev = get_device(kind=args.device)
        bucket = row_bucket(dev.type, dev.compile)
    rows, width, supervised = lengths.micro_batch(args.batch_size, args.seq_len, bucket, args.tokens_per_batch)
    data = {**asdict(lengths), "batch_size": args.batch_size, "max_seq_len": args.seq_len,
            "tokens_per_batch": args.tokens_per_batch}
    return replace(setup, batch_size=rows, seq_len=width, supervised_tokens=supervised), data


def cmd_estimate_serving(args: argparse.Namespace) -> int:
    device_bytes = device_type = None
    if not args.no_device:
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
    dev = get_device(kind=args.device, dtype=args.dtype)
    dev.set_current()
    cfg = GPTConfig.from_depth(args.depth, args.vocab_size, max_seq_len=args.seq_len)
    return measure_training_peak(cfg, args.batch_size, args.seq_len, dev, args.activation_checkpointing)
