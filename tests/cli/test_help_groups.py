"""vit-train --help's config groups (cli/help.py) against Hydra's own listing of the same search path
(hydra/_internal/hydra.py `format_config_groups`, the oracle): the same lines, but for the typed schema's
`schema/<group>/<name>` nodes, which no command line chooses; with your own options' folder too."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra.core.global_hydra import GlobalHydra

from vit_train.cli.arguments import search_dirs
from vit_train.cli.help import config_groups
from vit_train.cli.nodes import register_options
from vit_train.config import config_dir

TOY = Path(__file__).resolve().parents[1] / "helpers" / "toy_configs"


def hydras_listing(places: list[str]) -> list[str]:
    """Hydra's listing, as its --help makes it, of vit-train's configs/ and `places` (as --config-dir adds them)."""
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_config_search_path

    register_options()
    path = create_config_search_path(f"file://{config_dir()}")
    for place in places:
        path.append("command-line", place)
    hydra = Hydra.create_main_hydra2("vit-train", path)
    try:
        text = hydra.format_config_groups(lambda group: not (group == "hydra" or group.startswith("hydra/")))
    finally:
        GlobalHydra.instance().clear()
    return text.splitlines()


@pytest.mark.parametrize("with_own", [False, True], ids=["vit-train's", "with your own options"])
def test_the_groups_are_hydras_but_the_schema_nodes(tmp_path, with_own):
    places = []
    if with_own:
        (tmp_path / "data").mkdir()
        (tmp_path / "data" / "stripes.yaml").write_text("defaults:\n  - /schema/data/shapes@_here_\n  - _self_\n")
        (tmp_path / "model").mkdir()
        (tmp_path / "model" / "vit_mini.yaml").write_text("name: vit_mini\n")
        (tmp_path / "callbacks" / "nested").mkdir(parents=True)
        (tmp_path / "callbacks" / "nested" / "mine.yaml").write_text("{}\n")
        places = [f"file://{tmp_path}"]
    theirs = hydras_listing(places)
    ours = [f"{group}: {', '.join(options)}" for group, options in config_groups(search_dirs(places)).items()]
    assert any(line.startswith("schema/") for line in theirs)
    assert ours == [line for line in theirs if not line.startswith("schema/")]
    if with_own:
        assert "data: cifar10, cifar100, hf, imagefolder, shapes, stripes, webdataset" in ours
        assert "callbacks/nested: mine" in ours
