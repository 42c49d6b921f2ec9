"""What each command runs, one module per command group (`run/train.py` for `commands/train.py`).

These modules import the library (torch) at their top. `cli.py` never imports them to build the
parsers: a command's `func` is `commands.common.later(group, function)`, which imports its run
module when the command runs, so `portachat --help` and every `<command> --help` stay torch-free.
"""
