"""`portachat doctor`.

What runs. The flags are in commands/doctor.py, which `--help` imports without torch."""

from __future__ import annotations

import argparse

from portachat.speedrun.doctor import run_doctor


def cmd_doctor(args: argparse.Namespace) -> int:
    return run_doctor(as_json=args.json, calibrate=args.calibrate, selftest=args.selftest)
