"""`--help` of every console script in pyproject.toml: it opens with what that command does in its usual form,
its own first line (no two commands open alike), and none is Hydra's "powered by Hydra" banner."""

import contextlib
import importlib
import io
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

SCRIPTS = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]["scripts"]


def help_of(name: str) -> subprocess.CompletedProcess:
    """`NAME --help` through its entry point (pyproject.toml's module:function), as the installed script runs it:
    vit-train's (Hydra's help) in a subprocess, the other commands' (argparse) in this process, which saves a
    Python start of seconds each."""
    module, function = SCRIPTS[name].split(":")
    if name == "vit-train":
        code = f"import sys; from {module} import {function} as main; sys.argv[0] = {name!r}; main()"
        return subprocess.run([sys.executable, "-c", code, "--help"], capture_output=True, text=True, timeout=300)
    main = getattr(importlib.import_module(module), function)
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        patch.setattr(sys, "argv", [name, "--help"])
        try:
            main()
            status = 0
        except SystemExit as e:
            status = e.code or 0
    return subprocess.CompletedProcess([name, "--help"], status, out.getvalue(), err.getvalue())


@pytest.fixture(scope="module")
def helps() -> dict[str, subprocess.CompletedProcess]:
    return {name: help_of(name) for name in SCRIPTS}


def test_every_command_is_covered():
    assert {"vit-train", "vit-eval", "vit-predict", "vit-export", "vit-shards"} <= set(SCRIPTS)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_help_opens_with_what_the_command_does(helps, name):
    done = helps[name]
    assert done.returncode == 0, done.stderr
    first = done.stdout.splitlines()[0]
    assert name in first.split(), first  # the command itself, in its usual form
    assert "powered by hydra" not in done.stdout.lower(), done.stdout[:500]
    others = {other: h.stdout.splitlines()[0] for other, h in helps.items() if other != name and h.stdout}
    assert first not in others.values(), others  # not one block shared by several commands


def test_vit_train_help_still_lists_the_config_groups_and_keys(helps):
    text = helps["vit-train"].stdout
    assert text.startswith("vit-train [group=option ...] [key=value ...]: train a Vision Transformer")
    assert "== Configuration groups ==" in text and "model: " in text and "== Config ==" in text
    assert "\nmodel:\n  name: vit_micro" in text  # the composed config, as before


@pytest.mark.parametrize("name, usage", [("vit-eval", "usage: vit-eval ckpt=PATH"),
                                         ("vit-predict", "usage: vit-predict ckpt=PATH images="),
                                         ("vit-export", "usage: vit-export ckpt=PATH format="),
                                         ("vit-shards", "usage: vit-shards data=NAME")])
def test_a_command_shows_its_own_usage_only(helps, name, usage):
    text = helps[name].stdout
    assert usage in text
    assert not any(f"usage: {other} " in text for other in SCRIPTS if other != name)  # not the others' lines
