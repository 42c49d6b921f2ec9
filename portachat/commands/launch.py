"""`--nproc N`: a training command starts its own torchrun processes, so nobody writes a torchrun line.

The command re-runs itself as `python -m torch.distributed.run --nproc_per_node N [--nnodes ...] -m
portachat <the same arguments without --nproc>`; inside the workers LOCAL_RANK is set, so they train.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Sequence

from portachat.commands.common import flag, int_at_least, positive_int
from portachat.i18n import _

LAUNCH_FLAGS = ("--nproc", "--nnodes", "--node-rank", "--master-addr", "--master-port", "--rdzv-endpoint")


def add_launch_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(_("launch (several devices or machines, without writing a torchrun line)"))
    flag(g, "--nproc", type=positive_int, default=None,
         help=_("processes on this machine, one per device: starts torchrun itself (default: 1, or torchrun's own)"))
    flag(g, "--nnodes", type=positive_int, default=1, help=_("machines taking part (with --nproc; default 1)"))
    flag(g, "--node-rank", type=int_at_least(0), default=0, help=_("this machine's index among --nnodes (default 0)"))
    flag(g, "--rdzv-endpoint", default=None,
         help=_("HOST:PORT of node 0 for a multi-machine run (c10d rendezvous; default 127.0.0.1:29500)"))


def under_launcher() -> bool:
    return "LOCAL_RANK" in os.environ


def strip_launch_flags(argv: Sequence[str]) -> list[str]:
    """argv without --nproc & co (both spellings, `--flag value` and `--flag=value`)."""
    names = {f for f in LAUNCH_FLAGS} | {"--" + f[2:].replace("-", "_") for f in LAUNCH_FLAGS}
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        key = arg.split("=", 1)[0]
        if key in names:
            skip = "=" not in arg
            continue
        out.append(arg)
    return out


def torchrun_command(args: argparse.Namespace, argv: Sequence[str]) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={args.nproc}", f"--nnodes={args.nnodes}"]
    if args.nnodes > 1:
        endpoint = args.rdzv_endpoint or "127.0.0.1:29500"
        cmd += ["--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--node-rank={args.node_rank}"]
    else:
        cmd += ["--standalone"]
    return [*cmd, "-m", "portachat", *strip_launch_flags(argv)]


def maybe_launch(args: argparse.Namespace) -> int | None:
    """Start torchrun and return its exit code when --nproc asks for it; None means "run here"."""
    nproc = getattr(args, "nproc", None)
    if nproc is None or under_launcher() or (nproc == 1 and getattr(args, "nnodes", 1) == 1):
        return None
    cmd = torchrun_command(args, sys.argv[1:])
    print("[portachat] " + _("launching: {command}").format(command=" ".join(cmd)), file=sys.stderr, flush=True)
    return subprocess.call(cmd)
