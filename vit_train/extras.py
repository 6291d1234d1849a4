"""Optional extras: whether a package that only some features need is installed, and the one
message that names the extra installing it (pyproject.toml's [project.optional-dependencies])."""

from __future__ import annotations

import importlib.util

from vit_train.errors import ConfigError, UserError

# Module -> the extra that installs it.
EXTRAS = {
    "matplotlib": "viz",
    "safetensors": "export",
    "onnx": "export",
    "onnxscript": "export",
    "onnxruntime": "export",
    "hydra_plugins.hydra_optuna_sweeper": "sweep",
    "hydra_plugins.hydra_joblib_launcher": "sweep",
    "hydra_plugins.hydra_submitit_launcher": "slurm",
    "webdataset": "data",
    "datasets": "data",
}


def available(module: str) -> bool:
    """True when `module` can be imported (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a dotted name whose parent package is missing
        return False


def require(module: str, what: str, hint: str = "", error: type[UserError] = ConfigError, needs: str = "") -> None:
    """Raise `error` ("WHAT needs MODULE: pip install 'vit-train[EXTRA]'HINT") unless `module` is
    installed; `needs` words what is missing when the module's name would not tell a user."""
    if not available(module):
        raise error(f"{what} needs {needs or module.split('.')[-1]}: pip install 'vit-train[{EXTRAS[module]}]'{hint}")
