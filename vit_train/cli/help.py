"""`vit-train --help`: Hydra's help template (configs/hydra/default.yaml `hydra.help`) filled as Hydra fills it
(hydra/_internal/hydra.py `get_help`: the config groups, then the composed config), from the composition the
command line was read with (compose.py `read`).

The groups are the ones a command line chooses from: the YAML options in the config search path's folders
(vit-train's configs/, --config-dir, hydra.searchpath), as Hydra lists them, without Hydra's own groups and
without the typed schema's `schema/<group>/<name>` nodes, which the YAML options extend and no command line
chooses. Hydra's listing copies its whole config repository (every schema node) for each of its ~140 lookups:
longer than `import torch` (docs/speed.md, "Start-up")."""

from __future__ import annotations

import string
from pathlib import Path

from omegaconf import DictConfig, OmegaConf


def config_groups(dirs: list[Path]) -> dict[str, list[str]]:
    """group (a folder under a config folder, nested as `a/b`) -> its options (YAML file names, sorted), over the
    config folders `dirs`; Hydra's own groups (`hydra/...`) left out."""
    found: dict[str, set[str]] = {}
    for root in dirs:
        if not root.is_dir():
            continue
        for path in root.rglob("*.yaml"):
            group = path.parent.relative_to(root).as_posix()
            if group != "." and group.split("/")[0] != "hydra" and path.is_file():
                found.setdefault(group, set()).add(path.stem)
    return {group: sorted(found[group]) for group in sorted(found)}


def help_text(cfg: DictConfig, dirs: list[Path], resolve: bool = False) -> str:
    """The help of Hydra's composition `cfg` (its hydra node included), the groups listed from `dirs`; as Hydra
    prints it (its print's newline included)."""
    groups = "".join(f"{group}: {', '.join(options)}\n" for group, options in config_groups(dirs).items())
    job = OmegaConf.masked_copy(cfg, [str(k) for k in cfg if k != "hydra"])  # the config without Hydra's node
    template = string.Template(cfg.hydra.help.template)
    return (
        template.substitute(
            FLAGS_HELP="",
            HYDRA_CONFIG_GROUPS="",
            APP_CONFIG_GROUPS=groups,
            CONFIG=OmegaConf.to_yaml(job, resolve=resolve),
        )
        + "\n"
    )
