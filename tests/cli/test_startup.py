"""What vit-train imports before the config is known to be valid (docs/speed.md, "Start-up"): a config error, --help
and --cfg job answer without importing torch, also with an installed package of options that cannot be imported (one
warning line names it; the command does what it always does)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# vit-train's own entry (vit_train/__main__.py), with a line on stderr at exit saying whether torch was imported
ENTRY = ("import atexit, runpy, sys; atexit.register(lambda: print('torch imported:', 'torch' in sys.modules, "
         "file=sys.stderr)); sys.argv = ['vit-train', *sys.argv[1:]]; runpy.run_module('vit_train', run_name='__main__')")


def vit_train(args: list[str], cwd: Path, pythonpath: list[str] = ()) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *pythonpath])}
    return subprocess.run([sys.executable, "-c", ENTRY, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("args, status, shown", [
    (["data=nope"], 2, "vit-train: error: "),
    (["--help"], 0, "== Configuration groups =="),
    (["--cfg", "job"], 0, "name: shapes"),
], ids=["config-error", "help", "cfg-job"])
def test_the_answers_before_a_run_import_no_torch(tmp_path, args, status, shown):
    done = vit_train(args, tmp_path)
    assert done.returncode == status, done.stderr
    assert shown in done.stdout + done.stderr
    assert done.stderr.splitlines()[-1] == "torch imported: False"


def test_help_with_a_package_of_options_that_cannot_be_imported_is_the_help_and_one_line(tmp_path):
    """A broken plugin once broke every command of other tools, --help included."""
    site = tmp_path / "site"
    (site / "their_options-0.1.dist-info").mkdir(parents=True)
    (site / "their_options.py").write_text("raise ImportError('their_options needs a package that is not installed')\n")
    (site / "their_options-0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: their-options\nVersion: 0.1\n")
    (site / "their_options-0.1.dist-info" / "entry_points.txt").write_text("[vit_train.options]\ntheirs = their_options\n")
    done = vit_train(["--help"], tmp_path, [str(site)])
    assert done.returncode == 0 and "== Configuration groups ==" in done.stdout, done.stderr
    assert "data: cifar10, cifar100, hf, imagefolder, shapes, webdataset" in done.stdout
    assert done.stderr.splitlines() == [
        "the options of their_options (entry point theirs of vit_train.options, package their-options 0.1) are not "
        "available: ImportError: their_options needs a package that is not installed", "torch imported: False"]


COPIES = """
import atexit, runpy, sys
import hydra._internal.config_repository as repository
made = []
plain = repository.CachingConfigRepository.__init__
repository.CachingConfigRepository.__init__ = lambda self, delegate: made.append(1) or plain(self, delegate)
atexit.register(lambda: print("copies:", len(made), file=sys.stderr))
sys.argv = ["vit-train", *sys.argv[1:]]
runpy.run_module("vit_train", run_name="__main__")
"""


def test_help_copies_hydras_config_repository_once_and_lists_the_groups_a_command_line_chooses(tmp_path):
    """Hydra's own listing makes a fresh deep copy of its repository (the ConfigStore with every option's schema
    node) for each of its ~140 lookups, longer than `import torch`; vit-train's --help (cli/help.py) makes the one
    copy that composes the config it shows, and lists the YAML options, not the `schema/*` nodes."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", COPIES, "--help"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[-1] == "copies: 1"
    groups = "aug, callbacks, data, experiment, hparams_search, logger, model, objective, optim, schedule, trainer"
    listed = [line.split(":")[0] for line in done.stdout.split("== Configuration groups ==")[1]
              .split("== Config ==")[0].splitlines() if ": " in line]
    assert listed == groups.split(", "), done.stdout
    assert "data: cifar10, cifar100, hf, imagefolder, shapes, webdataset" in done.stdout
