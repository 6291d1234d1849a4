"""The run's config with every option registered: `from vit_train.config import Config`.

The typed schema is vit_train/schema/ (no torch): the sections every run has and the bases of the
three varying groups. Each option of a group is one module that registers its class when imported:
the data sets in data/sources/, the augmentations in data/aug/, the objectives in objectives/. This
package imports every module of those three folders, and the modules that installed packages name
in the entry-point group `vit_train.options` (your own options, docs/extending.md), so a config read
here knows every option (Config.from_dict, a checkpoint's saved config, the command line's Hydra
nodes in cli/).
"""

import dataclasses
import importlib
import logging
import pkgutil
from importlib.metadata import entry_points


from vit_train import objectives, optim, schedules
from vit_train.data import aug, sources
from vit_train.models import families
from vit_train.errors import ConfigError
from vit_train.schema.config import Config, config_dir, run_dir_of  # noqa: F401 (the public names)
from vit_train.schema.typed import REGISTRY, build


def _unusable(cls: type) -> str | None:
    """Why another package's option class cannot be chosen (None when it can): its defaults must make it and pass
    its own types, and the group's default stays vit-train's (the command line also drops one whose keys a Hydra
    node cannot hold: cli/nodes.py `register_options`)."""
    try:
        plain = dataclasses.asdict(cls())
    except Exception as e:  # noqa: BLE001 - their code
        return f"its class cannot be made from its defaults ({type(e).__name__}: {e}); give every key a default"
    try:
        build(cls, plain, f"{cls.group}.", [])
    except ConfigError as e:
        return f"its defaults do not pass its own types ({e})"
    if cls.__dict__.get("default"):
        return f"it sets default = True, but the default {cls.group} is vit-train's; drop that line"
    return None

for _package in (families, optim, schedules, sources, aug, objectives):
    for _module in pkgutil.iter_modules(_package.__path__):
        importlib.import_module(f"{_package.__name__}.{_module.name}")
for _plugin in entry_points(group="vit_train.options"):
    _before = {group: dict(found) for group, found in REGISTRY.items()}
    try:
        _plugin.load()  # a module of options outside vit-train: importing it registers them
    except Exception as _error:  # noqa: BLE001 - another package's code: said in one line, vit-train's own go on
        logging.getLogger("vit_train").warning(
            "the options of %s (entry point %s of vit_train.options) are not available: %s: %s", _plugin.value,
            _plugin.name, type(_error).__name__, str(_error).splitlines()[0] if str(_error) else "")
    for _group, _found in REGISTRY.items():
        for _name, _cls in list(_found.items()):
            _problem = None if _before.get(_group, {}).get(_name) is _cls else _unusable(_cls)
            if _problem:  # one line, and the option is not there: every other command works
                del _found[_name]
                logging.getLogger("vit_train").warning("%s=%s (%s.%s) is not available: %s", _group, _name,
                                                       _cls.__module__, _cls.__qualname__, _problem)
