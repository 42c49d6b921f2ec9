"""How long `portachat ... --help` takes in a fresh interpreter, against the interpreter's own start.

Peer: `python -c pass` (the same interpreter, nothing imported): the ratio says what the command line
adds to starting Python, which travels between machines better than seconds do. Each command runs
--runs times in a fresh process; the median counts.

    .venv/bin/python benchmarks/cli_help.py                      # this checkout
    .venv/bin/python benchmarks/cli_help.py --checkout /tmp/old  # another checkout's portachat/ (e.g. a
                                                                 # `git archive <commit> portachat | tar -x -C /tmp/old`)
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

COMMANDS = (["--help"], ["serve", "--help"], ["train", "sft", "--help"], ["export", "gguf", "--help"],
            ["speedrun", "--help"], ["eval", "--help"])

# Runs portachat's main from --checkout when given (ahead of the editable install's finder).
BOOT = """
import sys
checkout = sys.argv.pop(1)
if checkout:
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
    sys.path.insert(0, checkout)
from portachat.cli import main
sys.exit(main(sys.argv[1:]))
"""


def median_seconds(argv: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9, help="fresh processes per command (default 9)")
    parser.add_argument("--checkout", default="", help="directory holding the portachat/ package to time")
    args = parser.parse_args()
    peer = median_seconds([sys.executable, "-c", "pass"], args.runs)
    print(f"peer: python -c pass  {peer * 1000:.0f} ms (median of {args.runs})")
    print(f"{'command':32} {'median':>8} {'beyond python':>14} {'x peer':>7}")
    for command in COMMANDS:
        t = median_seconds([sys.executable, "-c", BOOT, args.checkout, *command], args.runs)
        name = "portachat " + " ".join(command)
        print(f"{name:32} {t * 1000:6.0f} ms {(t - peer) * 1000:11.0f} ms {t / peer:6.1f}x")


if __name__ == "__main__":
    main()
