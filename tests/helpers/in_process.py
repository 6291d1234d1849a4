"""A command's entry point run in this process, as its console script runs it (a subprocess would spend
seconds importing torch): `run_main`. The tests that are about the process itself (signals, exit codes of a
real child, the console script's own start) use tests/helpers/runs.py instead."""

from __future__ import annotations

import sys
from typing import Callable


def run_main(main: Callable[[], object], monkeypatch, capsys, *args: str, prog: str = "prog") -> tuple[int, str, str]:
    """`main()` (vit_train.cli.commands' eval_main, predict_main, shards_main, ...; cli.train's train_main) with
    `sys.argv` = [prog, *args]: (exit status, stdout, stderr); status 0 when it returns, else SystemExit's code.
    What the test printed before is dropped first (datasets' progress bars), so the output is the command's."""
    capsys.readouterr()
    monkeypatch.setattr(sys, "argv", [prog, *args])
    try:
        main()
        status = 0
    except SystemExit as e:
        status = e.code
    out, err = capsys.readouterr()
    return status, out, err
