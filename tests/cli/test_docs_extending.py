"""docs/extending.md's example, copied as a user copies it: its Python blocks into `my_options.py`, its YAML blocks
into `configs/<group>/<name>.yaml` (each block's first line names its file), and its "Running it" commands run
on them, in this process, with tiny settings appended. A broken example fails here, not in a user's terminal."""

from __future__ import annotations

import importlib
import json
import re
import shlex
import sys
from pathlib import Path

import pytest

from helpers.in_process import run_main
from helpers.registry import registry_kept

PAGE = Path(__file__).resolve().parents[2] / "docs" / "extending.md"
CONFIGS = Path(__file__).resolve().parents[2] / "configs"
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
TINY = ["model.embed_dim=16", "model.depth=1", "model.num_heads=2", "data.batch_size=16", "trainer.device=cpu",
        "trainer.progress=false", "trainer.max_steps=2", "schedule.warmup_epochs=0"]


def blocks(language: str) -> list[str]:
    return [text for lang, text in BLOCK.findall(PAGE.read_text()) if lang == language]


def running_it() -> list[list[str]]:
    """The vit-train commands of the page's bash blocks, as argument lists."""
    return [shlex.split(line.split("vit-train", 1)[1], comments=True) for text in blocks("bash")
            for line in text.splitlines() if line.startswith("vit-train ")]


@pytest.fixture
def mine(tmp_path):
    """The user's folder, as the page builds it, its module imported (as an installed package's entry point
    would be on the registry's first lookup); unregistered again after the test."""
    from vit_train.cli.train import register_options

    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "my_options.py").write_text("\n\n".join(blocks("python")))
    for text in blocks("yaml"):
        name = re.match(r"# (\w+/\w+\.yaml):", text).group(1)  # "# data/stripes.yaml: ..."
        (folder / "configs" / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / "configs" / name).write_text(text)
    sys.path.insert(0, str(folder))
    with registry_kept():
        try:
            importlib.import_module("my_options")
            register_options()
            yield folder
        finally:
            sys.path.remove(str(folder))
            sys.modules.pop("my_options", None)


def test_the_page_shows_a_module_its_yaml_and_commands():
    assert len(blocks("python")) >= 2 and len(blocks("yaml")) >= 2 and len(running_it()) >= 2
    assert not re.search(r"^\s*\.\.\.", blocks("python")[0], re.M)  # the data set is whole: no `...` for its code


def test_running_it_uses_only_what_the_page_defines():
    """Every option a command of "Running it" chooses is vit-train's own or one the page's YAML blocks make."""
    made = {re.match(r"# (\w+/\w+)\.yaml:", text).group(1) for text in blocks("yaml")}
    for args in running_it():
        for arg in args:
            group, _, value = arg.partition("=")
            for name in value.strip("[]").split(","):  # a list group's options: callbacks=[a,b]
                if (CONFIGS / group).is_dir():
                    assert f"{group}/{name}" in made or (CONFIGS / group / f"{name}.yaml").is_file(), arg


def test_the_pages_data_set_trains_with_its_commands(mine, tmp_path, monkeypatch, capsys):
    from vit_train.cli.train import train_main

    for k, args in enumerate(running_it()):
        args = [f"hydra.searchpath=[file://{mine / 'configs'}]" if a.startswith("hydra.searchpath=") else a
                for a in args]
        args = [*TINY, f"hydra.run.dir={tmp_path / f'run{k}'}", *args]  # the flags (--cfg job) stay last
        status, out, err = run_main(train_main, monkeypatch, capsys, *args, prog="vit-train")
        assert status == 0, (args, out, err)
        if "--cfg" in args:
            assert "name: stripes" in out and "stripe_width: 3" in out, out
        else:
            assert "completed:" in out and "2 classes" in out, (out, err)
            assert (tmp_path / f"run{k}" / "results.json").is_file()
            if any("best_so_far" in a for a in args):  # the page's callback wrote its file, from its evaluation
                record = json.loads((tmp_path / f"run{k}" / "best_so_far.json").read_text())
                val = [json.loads(line) for line in (tmp_path / f"run{k}" / "metrics.jsonl").read_text().splitlines()
                       if '"val"' in line]
                assert record == {"metric": "val/top1", "best": max(r["top1"] for r in val),
                                  "step": max(val, key=lambda r: r["top1"])["step"], "status": "completed"}, record
