"""The run's config: `from vit_train.config import Config`.

The typed schema is vit_train/schema/ (no torch): the sections every run has, the bases of the six varying groups,
and the registry of their options, which imports the options' modules on its first lookup (schema/typed.py
`load_options`: vit-train's own, listed in `BUILT_IN`, then those that installed packages name in the entry-point
group `vit_train.options`, docs/extending.md). A config read here or from vit_train.schema.config knows every option
(Config.from_dict, a checkpoint's saved config, the command line's Hydra nodes in cli/) without importing torch.
"""

from vit_train.schema.config import Config, config_dir, run_dir_of  # noqa: F401 (the public names)
