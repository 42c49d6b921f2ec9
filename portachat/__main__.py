"""`python -m portachat ...` (and `torchrun -m portachat ...`) runs the command line."""

from portachat.device.early_env import apply_early_defaults

apply_early_defaults()  # before anything imports torch: the vendor runtime torch autoloads reads them then

from portachat.cli import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
