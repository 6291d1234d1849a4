"""The run's config with every option registered: `from vit_train.config import Config`.

The typed schema is vit_train/schema/ (no torch): the sections every run has and the bases of the
three varying groups. Each option of a group is one module that registers its class when imported:
the data sets in data/sources/, the augmentations in data/aug/, the objectives in objectives/. This
package imports every module of those three folders, and the modules that installed packages name
in the entry-point group `vit_train.options` (your own options, docs/extending.md), so a config read
here knows every option (Config.from_dict, a checkpoint's saved config, the command line's Hydra
nodes in cli/).
"""

import importlib
import logging
import pkgutil
from importlib.metadata import entry_points

from vit_train.data import aug, sources
from vit_train import objectives
from vit_train.schema.config import Config, config_dir, run_dir_of  # noqa: F401 (the public names)

for _package in (sources, aug, objectives):
    for _module in pkgutil.iter_modules(_package.__path__):
        importlib.import_module(f"{_package.__name__}.{_module.name}")
for _plugin in entry_points(group="vit_train.options"):
    try:
        _plugin.load()  # a module of options outside vit-train: importing it registers them
    except Exception as _error:  # noqa: BLE001 - another package's code: said in one line, vit-train's own go on
        logging.getLogger("vit_train").warning(
            "the options of %s (entry point %s of vit_train.options) are not available: %s: %s", _plugin.value,
            _plugin.name, type(_error).__name__, str(_error).splitlines()[0] if str(_error) else "")
