"""`portachat train base|...`: the training stages."""

from __future__ import annotations

import argparse
import re
from dataclasses import replace

from portachat.commands.common import (
    EPILOG,
    device_from_args,
    flag,
    int_at_least,
    nonneg_int,
    positive_int,
    report_result,
)
from portachat.commands.finetune_args import finetune_options, wants_finetune
from portachat.commands.launch import add_launch_flags, maybe_launch
from portachat.i18n import _
from portachat.speedrun.presets import training_defaults


def _batch_size(text: str) -> int | str:
    from portachat.train.batch_size import parse_device_batch_size  # deferred: loads torch

    try:
        return parse_device_batch_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_train_flags(p: argparse.ArgumentParser) -> None:
    from portachat.train.optim import OptimConfig  # deferred: loads torch
    from portachat.train.trainer import TrainConfig  # deferred: loads torch

    d, o = TrainConfig(), OptimConfig()
    g = p.add_argument_group(_("run"))
    # `--run` alone is ambiguous under torchrun (its parser prefix-matches --run-path), hence --run-name.
    g.add_argument("--run-name", "--run_name", "--run", dest="run", default="default",
                   help=_("run name: checkpoints go to <home>/runs/<run>/<stage>/ (default: default)"))
    flag(g, "--runs-root", default=None, help=_("directory holding runs (default: $PORTACHAT_HOME/runs)"))
    flag(g, "--resume", nargs="?", const="auto", default=None,
          help=_("continue from this run's latest checkpoint, or from the checkpoint PATH given"))
    flag(g, "--overwrite", action="store_true", help=_("delete this run's existing checkpoints for the stage and start over"))
    flag(g, "--seed", type=int, default=d.seed, help=_("random seed (default %(default)s)"))
    g = p.add_argument_group(_("device"))
    flag(g, "--device", default=None, help=_("cpu|cuda|rocm|dcu|npu|xpu|mps (default: auto-detect)"))
    flag(g, "--dtype", default=None, help=_("bf16|fp16|fp32 compute dtype (default: the device's best; see `portachat doctor`)"))
    flag(g, "--compile", default=None, choices=["0", "1"], help=_("torch.compile the model (default: per device policy)"))
    flag(g, "--fsdp", default=d.fsdp, choices=["auto", "on", "off"],
         help=_("shard weights, gradients and optimizer state across processes with FSDP2 (ZeRO-3) instead of DDP "
              "replicas; auto = when the memory estimate of a replica exceeds the device's memory (default auto)"))
    add_launch_flags(p)
    g = p.add_argument_group(_("batch and horizon"))
    flag(g, "--device-batch-size", type=_batch_size, default=None,
         help=_("rows per device per micro-step, or auto = the largest that fits, found by real steps "
              "(default: 32 on accelerators, 4 on CPU)"))
    flag(g, "--activation-checkpointing", action=argparse.BooleanOptionalAction, default=None,
         help=_("recompute each block's activations in backward: much less memory for ~30%% more compute "
                "(default: on when fine-tuning an existing model on a CPU, off otherwise)"))
    flag(g, "--total-batch-size", type=positive_int, default=None,
          help=_("tokens per optimizer step; gradient accumulation makes up the difference (default: one micro-step)"))
    flag(g, "--max-seq-len", type=positive_int, default=None, help=_("tokens per row (default: 2048 on accelerators, 256 on CPU)"))
    flag(g, "--num-iterations", type=positive_int, default=None, help=_("optimizer steps (default: from --target-param-data-ratio)"))
    g = p.add_argument_group(_("optimization"))
    flag(g, "--matrix-lr", type=float, default=o.matrix_lr, help=_("Muon lr for hidden matrices (default %(default)s)"))
    flag(g, "--embedding-lr", type=float, default=o.embedding_lr, help=_("AdamW lr for embeddings (default %(default)s)"))
    flag(g, "--unembedding-lr", type=float, default=o.unembedding_lr, help=_("AdamW lr for the LM head (default %(default)s)"))
    flag(g, "--scalar-lr", type=float, default=o.scalar_lr, help=_("AdamW lr for norm gains (default %(default)s)"))
    flag(g, "--weight-decay", type=float, default=o.weight_decay, help=_("AdamW weight decay (default 0)"))
    flag(g, "--warmup-ratio", type=float, default=d.warmup_ratio, help=_("fraction of steps warming up (default %(default)s)"))
    flag(g, "--warmdown-ratio", type=float, default=d.warmdown_ratio, help=_("fraction of steps decaying to the end (default %(default)s)"))
    flag(g, "--final-lr-frac", type=float, default=d.final_lr_frac, help=_("lr at the end, as a fraction (default 0)"))
    flag(g, "--grad-clip", type=float, default=d.grad_clip, help=_("clip gradient norm; 0 = off (default %(default)s)"))
    flag(g, "--max-bad-steps", type=positive_int, default=d.max_bad_steps,
          help=_("abort after this many non-finite steps in a row (default %(default)s)"))
    g = p.add_argument_group(_("evaluation, logging, checkpoints"))
    flag(g, "--eval-every", type=nonneg_int, default=d.eval_every, help=_("validate every N steps; 0 = only at the end (default %(default)s)"))
    flag(g, "--eval-tokens", type=positive_int, default=d.eval_tokens, help=_("validation tokens per evaluation (default %(default)s)"))
    flag(g, "--sample-every", type=nonneg_int, default=d.sample_every, help=_("print samples at evaluations on multiples of N steps; 0 = at every evaluation"))
    flag(g, "--log-every", type=positive_int, default=d.log_every, help=_("progress line every N steps (default %(default)s)"))
    flag(g, "--save-every", type=nonneg_int, default=d.save_every, help=_("checkpoint every N steps; 0 = only at the end"))
    flag(g, "--keep-last", type=nonneg_int, default=d.keep_last, help=_("checkpoints kept per stage; 0 = all (default %(default)s)"))


def train_config(args: argparse.Namespace, dev, **overrides) -> object:
    """The TrainConfig the shared training flags ask for; `overrides`: a stage's own fields (it is frozen)."""
    from portachat.train.optim import OptimConfig  # deferred: loads torch
    from portachat.train.trainer import TrainConfig  # deferred: loads torch

    defaults = training_defaults(dev)
    return replace(TrainConfig(
        run=args.run,
        runs_root=args.runs_root,
        device_batch_size=args.device_batch_size or defaults.device_batch_size,
        activation_checkpointing=bool(args.activation_checkpointing),
        total_batch_size=args.total_batch_size,
        max_seq_len=args.max_seq_len or defaults.max_seq_len,
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
        fsdp=args.fsdp,
        optim=OptimConfig(
            matrix_lr=args.matrix_lr,
            embedding_lr=args.embedding_lr,
            unembedding_lr=args.unembedding_lr,
            scalar_lr=args.scalar_lr,
            weight_decay=args.weight_decay,
        ),
    ), **overrides)


def cmd_train_base(args: argparse.Namespace) -> int:
    from portachat.storage.hubs import has_hub_prefix  # deferred: loads torch

    if args.data and has_hub_prefix(args.data):
        # Downloaded here, before any launch: the ranks then find the shards on disk.
        from portachat.data.hub import pretraining_data_dir  # deferred: loads torch

        args.data = str(pretraining_data_dir(args.data))
    launched = maybe_launch(args)  # --nproc N: re-run this command under torchrun
    if launched is not None:
        return launched
    from portachat.device import destroy_distributed, dist_env  # deferred: loads torch
    from portachat.train.base import BaseOptions, run_base  # deferred: loads torch

    dev = device_from_args(args)
    opts = BaseOptions(
        data=args.data,
        tokenizer=args.tokenizer,
        vocab_size=args.vocab_size,
        tokenizer_max_chars=args.tokenizer_max_chars,
        depth=args.depth if args.depth is not None else training_defaults(dev).depth,
        target_param_data_ratio=args.target_param_data_ratio,
        num_iterations=args.num_iterations,
        resume=args.resume,
        overwrite=args.overwrite,
        train=train_config(args, dev),
    )
    try:
        result = run_base(opts, dev=dev)
    finally:
        destroy_distributed()
    if result.final_checkpoint is not None and dist_env().is_main:
        print("[portachat] " + _("done: {steps} steps, validation bits/byte {bpb}").format(
            steps=result.steps, bpb=f"{result.val_bpb:.4f}"))
        print("[portachat] " + _("model: {path}").format(path=result.final_checkpoint))
    return 0


def cmd_train_chat(args: argparse.Namespace) -> int:
    launched = maybe_launch(args)  # --nproc N: re-run this command under torchrun
    if launched is not None:
        return launched
    from portachat.device import destroy_distributed, dist_env  # deferred: loads torch
    from portachat.train.chat_stage import ChatOptions, run_chat_stage  # deferred: loads torch
    from portachat.train.finetune import run_finetune  # deferred: loads torch

    dev = device_from_args(args)
    opts = ChatOptions(
        stage=args.stage,
        init=args.init,
        data=args.data or [],
        max_conversations=args.max_conversations,
        pack={"pack": True, "pad": False, None: None}[args.rows],
        lr_scale=args.lr_scale,
        warmdown_ratio=args.warmdown_ratio,
        num_epochs=args.num_epochs,
        num_iterations=args.num_iterations,
        max_seq_len=args.max_seq_len,
        eval_examples=args.eval_examples,
        eval_max_tokens=args.eval_max_tokens,
        resume=args.resume,
        overwrite=args.overwrite,
        train=train_config(args, dev, tokens_per_batch=args.tokens_per_batch),
    )
    try:
        result = (run_finetune(finetune_options(args, opts), dev=dev) if wants_finetune(args)
                  else run_chat_stage(opts, dev=dev))
    finally:
        destroy_distributed()
    return report_result(result, dist_env().is_main)


_DEFAULT_SUFFIX = r" \(default|（默认"  # the shared help's own default note, in either language


def _stage_default(parser: argparse.ArgumentParser, dest: str, value, why: str) -> None:
    """A shared training flag with this stage's own default, said in its help."""
    for action in parser._actions:
        if action.dest == dest:
            action.default = value
            action.help = _("{help} (default {value} for this stage: {why})").format(
                help=re.split(_DEFAULT_SUFFIX, action.help)[0], value=value, why=why)


def add_finetune_flags(t: argparse.ArgumentParser) -> None:
    from portachat.train.finetune import FULL_LR, LORA_LR  # deferred: loads torch

    g = t.add_argument_group(_("fine-tuning an existing model (--init HF_DIR|FILE.gguf)"),
                             _("With --init naming a Hugging Face directory or a GGUF (Llama/SmolLM2, Qwen2, Qwen3), the "
                               "model keeps its tokenizer and chat template and trains with AdamW at fine-tuning rates."))
    flag(g, "--lr", type=float, default=None, help=_("AdamW learning rate (default {full} full, {lora} LoRA)").format(full=f"{FULL_LR:g}", lora=f"{LORA_LR:g}"))
    add_lora_flags(g)


def add_lora_flags(g) -> None:
    from portachat.train.lora import ALL_LINEAR  # deferred: loads torch

    flag(g, "--lora-rank", type=positive_int, default=None, help=_("train a LoRA adapter (peft) of this rank instead of all weights"))
    flag(g, "--lora-alpha", type=float, default=None, help=_("LoRA scale numerator (default: 2 x rank)"))
    flag(g, "--lora-targets", default=",".join(ALL_LINEAR), help=_("comma-separated modules (default %(default)s)"))
    flag(g, "--lora-dropout", type=float, default=0.0, help=_("dropout on the LoRA input (default 0)"))
    flag(g, "--merge", action="store_true", help=_("with --lora-rank: also write <stage>/merged/, the adapter folded in"))


def add_chat_stage_parser(tsub, stage: str) -> None:
    from portachat.train.chat_stage import PREVIOUS_STAGE, STAGE_DEFAULTS  # deferred: loads torch

    d = STAGE_DEFAULTS[stage]
    previous = PREVIOUS_STAGE[stage]
    what = {"mid": _("mid-train on conversations: the chat format and calculator tool use (packed rows)"),
            "sft": _("supervised fine-tuning on conversations (one conversation per padded row, low lr)")}[stage]
    t = tsub.add_parser(stage, help=what, epilog=EPILOG,
                        description=_("{what}. Starts from the run's {previous} checkpoint "
                                      "(<home>/runs/<run>/{previous}/latest) unless --init says otherwise; the loss "
                                      "covers only the assistant's tokens. Checkpoints go to "
                                      "<home>/runs/<run>/{stage}/step_<N>/.").format(
                            what=what[0].upper() + what[1:], previous=previous, stage=stage))
    g = t.add_argument_group(_("data and model"))
    flag(g, "--init", default=None,
         help=_("checkpoint to start from: a model dir, a stage dir, or RUN/STAGE (default: this run's {previous}/latest)")
         .format(previous=previous))
    flag(g, "--data", action="append", default=None,
         help=_("jsonl/parquet file or directory of conversations ('messages'), GSM8K 'question'/'answer' or "
              "ARC/MMLU multiple choice rows, or hf:OWNER/NAME[:GLOB] to download a Hub dataset; repeat to mix "
              "(default: built-in synthetic task conversations)"))
    flag(g, "--max-conversations", type=positive_int, default=None,
         help=_("read at most N conversations (synthetic default: {n})").format(n=d.synthetic_conversations))
    flag(g, "--rows", choices=["pack", "pad"], default=None,
         help=_("pack several conversations per row (each attends only to itself, positions restart) or put "
                "one per row; a batch is padded only to its longest row (default: {rows})")
         .format(rows="pack" if d.pack else "pad"))
    flag(g, "--tokens-per-batch", type=positive_int, default=None,
         help=_("draw each micro-batch by a token budget instead of --device-batch-size rows: as many "
                "conversations of similar length as fit N padded positions (at least --max-seq-len); "
                "--total-batch-size counts in these tokens (default: --device-batch-size rows)"))
    flag(g, "--lr-scale", type=float, default=None,
         help=_("multiply every learning rate by this (default {scale} for {stage})").format(scale=d.lr_scale, stage=stage))
    flag(g, "--num-epochs", type=float, default=1.0, help=_("passes over the data when --num-iterations is not given"))
    flag(g, "--eval-examples", type=nonneg_int, default=64, help=_("held-out questions answered at each evaluation"))
    flag(g, "--eval-max-tokens", type=positive_int, default=64, help=_("reply length limit when evaluating answers"))
    add_finetune_flags(t)
    add_train_flags(t)
    t.set_defaults(func=cmd_train_chat)
    _stage_default(t, "warmdown_ratio", d.warmdown_ratio, _("it starts from trained weights"))


def cmd_train_rl(args: argparse.Namespace) -> int:
    launched = maybe_launch(args)  # --nproc N: re-run this command under torchrun
    if launched is not None:
        return launched
    from portachat.device import destroy_distributed, dist_env  # deferred: loads torch
    from portachat.train.lora import lora_from_flags  # deferred: loads torch
    from portachat.train.rl import RLOptions, run_rl  # deferred: loads torch

    dev = device_from_args(args)
    if args.device_batch_size == "auto":
        from portachat.train.trainer import TrainingError  # deferred: loads torch

        raise TrainingError(_("train rl: --device-batch-size auto is not supported (rows are groups of replies); "
                              "give a multiple of --num-samples ({n})").format(n=args.num_samples))
    rows = args.device_batch_size or args.num_samples * training_defaults(dev).rl_groups_per_row_batch
    cfg = train_config(args, dev, device_batch_size=rows)
    opts = RLOptions(
        init=args.init,
        data=args.data or [],
        max_prompts=args.max_prompts,
        num_samples=args.num_samples,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        normalize_std=args.normalize_std,
        lr_scale=args.lr_scale,
        warmdown_ratio=args.warmdown_ratio,
        num_epochs=args.num_epochs,
        num_iterations=args.num_iterations,
        eval_examples=args.eval_examples,
        rewards=args.reward or [],
        reward_weights=args.reward_weights,
        beta=args.beta,
        epsilon=args.epsilon,
        epsilon_high=args.epsilon_high,
        lr=args.lr,
        lora=lora_from_flags(args.lora_rank, args.lora_alpha, args.lora_targets, args.lora_dropout),
        merge=args.merge,
        resume=args.resume,
        overwrite=args.overwrite,
        train=cfg,
    )
    from portachat.train.grpo import run_grpo, wants_grpo  # deferred: loads torch

    run = run_grpo if wants_grpo(args.init, opts.rewards) else run_rl  # GRPO on any model, scored by the rewards
    try:
        result = run(opts, dev=dev)
    finally:
        destroy_distributed()
    return report_result(result, dist_env().is_main)


def _floats(text: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(_("expected comma-separated numbers, got {text}").format(text=repr(text))) from None


def add_rl_parser(tsub) -> None:
    from portachat.train.rl import RLOptions  # deferred: loads torch

    d = RLOptions()
    t = tsub.add_parser("rl", help=_("reinforcement learning on verifiable rewards (GRPO-style)"), epilog=EPILOG,
                        description=_("On-policy policy gradient with group-relative advantages: sample G replies per "
                                    "prompt through the inference engine (calculator on), reward 1 for a correct final "
                                    "answer, advantage = reward - group mean. Starts from the run's sft checkpoint "
                                    "(<home>/runs/<run>/sft/latest) unless --init says otherwise. Logs reward, pass@k "
                                    "and reply length every step. With --reward: GRPO on any model (--init a Hugging Face directory, a GGUF "
                                    "or a checkpoint) over the prompts of --data, scored by the rewards."))
    g = t.add_argument_group(_("tasks and sampling"))
    flag(g, "--init", default=None, help=_("checkpoint to start from (default: this run's sft/latest; with --reward any model)"))
    flag(g, "--data", action="append", default=None,
         help=_("jsonl/parquet rows with verifiable answers (GSM8K 'question'/'answer', ARC/MMLU); repeat to mix "
              "or hf:OWNER/NAME[:GLOB] (default: built-in synthetic tasks)"))
    flag(g, "--max-prompts", type=positive_int, default=None, help=_("use at most N prompts (synthetic default: 2000)"))
    flag(g, "--num-samples", type=int_at_least(2), default=d.num_samples, help=_("replies per prompt, G (default %(default)s)"))
    flag(g, "--max-new-tokens", type=positive_int, default=d.max_new_tokens, help=_("reply length limit (default %(default)s)"))
    flag(g, "--temperature", type=float, default=d.temperature, help=_("sampling temperature (default %(default)s)"))
    flag(g, "--normalize-std", action="store_true", help=_("divide advantages by the group's reward std (GRPO); default: mean only"))
    flag(g, "--lr-scale", type=float, default=d.lr_scale, help=_("multiply every learning rate by this (default %(default)s)"))
    flag(g, "--num-epochs", type=float, default=1.0, help=_("passes over the prompts when --num-iterations is not given"))
    flag(g, "--eval-examples", type=nonneg_int, default=d.eval_examples, help=_("held-out questions answered at each evaluation"))
    g = t.add_argument_group(_("GRPO for any model (--init MODEL --data PROMPTS.jsonl --reward ...)"))
    flag(g, "--reward", action="append", default=None,
         help=_("reward: synthetic, gsm8k, regex:PATTERN, length:N, or path.py:function (TRL's signature); repeat to "
                "combine. Switches to GRPO on --init (any model) over --data rows {'prompt': ...} or {'messages': "
                "[...]}; other columns reach the rewards"))
    flag(g, "--reward-weights", type=_floats, default=None, help=_("comma-separated weights, one per --reward (default 1 each)"))
    flag(g, "--beta", type=float, default=d.beta, help=_("weight of the KL to the starting model (default %(default)s: none kept)"))
    flag(g, "--epsilon", type=float, default=d.epsilon, help=_("clip range of the probability ratio (default %(default)s)"))
    flag(g, "--epsilon-high", type=float, default=None, help=_("upper clip range (default: --epsilon)"))
    flag(g, "--lr", type=float, default=None, help=_("AdamW learning rate for GRPO (default 1e-06, 1e-05 with --lora-rank)"))
    add_lora_flags(g)
    add_train_flags(t)
    t.set_defaults(func=cmd_train_rl)
    _stage_default(t, "warmdown_ratio", d.warmdown_ratio, _("linear decay to 0"))
    _stage_default(t, "eval_every", 20, _("each step samples many replies"))


def register(sub) -> None:
    p = sub.add_parser("train", help=_("training stages: base pretraining, mid-training, SFT, RL"))
    tsub = p.add_subparsers(dest="stage", metavar="STAGE")
    tsub.required = True
    t = tsub.add_parser("base", help=_("pretrain a GPT on raw text"), epilog=EPILOG,
                        description=_("Pretrain a GPT from raw text. Checkpoints are Hugging Face model directories under "
                                    "<home>/runs/<run>/base/step_<N>/. Runs under torchrun for multiple devices."))
    g = t.add_argument_group(_("data and model"))
    flag(g, "--data", default=None, help=_("file or directory of .parquet/.txt/.jsonl, or hf:OWNER/NAME[:GLOB] / "
                                            "modelscope:OWNER/NAME[:GLOB] to download a dataset's shards (default: "
                                            "built-in synthetic curriculum)"))
    flag(g, "--tokenizer", default=None, help=_("existing tokenizer directory (default: train one on --data)"))
    flag(g, "--vocab-size", type=positive_int, default=None, help=_("vocabulary size when training the tokenizer (default: sized from the data)"))
    flag(g, "--tokenizer-max-chars", type=positive_int, default=2_000_000_000, help=_("characters to train the tokenizer on"))
    flag(g, "--depth", type=int, default=None, help=_("transformer layers; width, heads and horizon follow (default: 20 on accelerators, 4 on CPU)"))
    flag(g, "--target-param-data-ratio", type=float, default=20.0, help=_("training tokens per parameter when --num-iterations is not given (default 20)"))
    add_train_flags(t)
    t.set_defaults(func=cmd_train_base)
    add_chat_stage_parser(tsub, "mid")
    add_chat_stage_parser(tsub, "sft")
    add_rl_parser(tsub)
