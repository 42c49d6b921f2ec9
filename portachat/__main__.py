"""`python -m portachat ...` (and `torchrun -m portachat ...`) runs the command line."""

from portachat.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
