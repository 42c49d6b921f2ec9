"""`portachat doctor`."""

from __future__ import annotations

from portachat.commands.common import later
from portachat.i18n import _


def register(sub) -> None:
    p = sub.add_parser("doctor", help=_("check the environment and print a report (exit 1 if something is wrong)"),
                       description=_("Environment report: versions, devices, dtype/compile/attention/collective choices and "
                                   "why, live probes (matmul TFLOPS, transfer bandwidth, all-reduce under torchrun), and "
                                   "known-bad setups with their fixes. Exit code 0 = healthy, 1 = something is wrong."))
    p.add_argument("--json", action="store_true", help=_("print the report as JSON"))
    p.add_argument("--calibrate", action="store_true", help=_("measure peak matmul FLOPS (cached) for devices not in the table"))
    p.add_argument("--selftest", action="store_true",
                   help=_("run every fast path this device would use beside its portable reference now, and keep "
                          "only those that agree (verdicts are cached)"))
    p.set_defaults(func=later("doctor", "cmd_doctor"))
