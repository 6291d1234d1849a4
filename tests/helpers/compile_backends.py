"""torch.compile backends for tests of trainer.compile (trainer.compile_backend=NAME): each registers under its
name with torch._dynamo and compiles as `aot_eager` does (dynamo's graph through AOT autograd, run by PyTorch's
own kernels: what the structure needs, in seconds), with a fault at the n-th compilation it is asked for:

  vit_test_failing     raises (a compiler that fails on this machine)
  vit_test_signalling  sends this process `signum` (a stop signal arriving while compiling), then waits in an
                       interruptible sleep, up to a minute, as a long compilation would

`arm(n, signum)` sets which compilation and which signal (1: the training step's, 2: the evaluation's with
trainer.compile_scope=step). As a script it runs vit-train's command line with the backends registered and
prints "compiling" when the n-th compilation starts (armed by VIT_TEST_COMPILE_N, no signal sent: a test
sends it from outside):

    python tests/helpers/compile_backends.py <vit-train overrides>
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.backends.debugging import boxed_nop

SETTINGS = {"n": 1, "signum": 0, "count": 0, "sent": None}  # sent: time.monotonic() when the signal was sent
AOT_EAGER = aot_autograd(fw_compiler=boxed_nop)  # what backend="aot_eager" is


def _nth(gm) -> bool:
    """Whether this compilation is the armed one; vit-train's probe of a backend (one addition: compiling.py
    `compile_scope`) is not counted."""
    if sum(node.op == "call_function" for node in gm.graph.nodes) <= 1:
        return False
    SETTINGS["count"] += 1
    return SETTINGS["count"] == SETTINGS["n"]


def failing(gm, example_inputs):
    if _nth(gm):
        raise RuntimeError("this compiler failed on purpose (tests/helpers/compile_backends.py)")
    return AOT_EAGER(gm, example_inputs)


def signalling(gm, example_inputs):
    if _nth(gm):
        print("compiling", flush=True)
        if SETTINGS["signum"]:
            SETTINGS["sent"] = time.monotonic()
            os.kill(os.getpid(), SETTINGS["signum"])
        for _ in range(600):  # a long compilation: each sleep is interruptible by a signal handler
            time.sleep(0.1)
    return AOT_EAGER(gm, example_inputs)


def arm(n: int, signum: int = 0) -> None:
    """The n-th compilation from now (1 = the next) fails or is signalled with `signum` (0: no signal)."""
    SETTINGS.update(n=n, signum=signum, count=0, sent=None)


for _name, _fn in (("vit_test_failing", failing), ("vit_test_signalling", signalling)):
    if _name not in torch._dynamo.list_backends(exclude_tags=()):
        torch._dynamo.register_backend(name=_name)(_fn)


if __name__ == "__main__":
    arm(int(os.environ.get("VIT_TEST_COMPILE_N", "1")))
    sys.argv = ["vit-train", *sys.argv[1:]]
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from vit_train.cli.train import train_main

    train_main()
