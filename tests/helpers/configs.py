"""Tiny configs: a micro ViT on a small shapes set, CPU only, as command-line overrides (`TINY`) or a
typed Config (`tiny_config`); `composed` gives what the command line composes."""

from __future__ import annotations

from pathlib import Path

from vit_train.config import Config

# A micro ViT on the CPU, as command-line overrides (`TINY_MODEL`), on a small shapes set (`TINY`): 4 steps per epoch.
TINY_MODEL = ["model.embed_dim=32", "model.depth=2", "model.num_heads=2", "model.img_size=16", "data.batch_size=32",
              "trainer.device=cpu", "trainer.progress=false"]
TINY = TINY_MODEL + ["data.train_size=128", "data.val_size=64"]  # shapes' own keys


def tiny_config(**sections) -> Config:
    """A micro ViT on a small shapes set; `sections` override keys, e.g. trainer={"max_steps": 3}."""
    plain = {
        "model": {"embed_dim": 32, "depth": 2, "num_heads": 2, "img_size": 16, "patch_size": 4},
        "data": {"train_size": 256, "val_size": 128, "batch_size": 32},
        "trainer": {"epochs": 2, "device": "cpu", "log_every": 2, "progress": False},
        "schedule": {"warmup_epochs": 0.5},
    }
    for name, values in sections.items():
        if isinstance(values, dict):
            plain.setdefault(name, {}).update(values)
        else:
            plain[name] = values
    if plain["model"].get("arch", "vit") != "vit":  # another family: the micro ViT's keys are not its own
        given = sections.get("model", {})
        plain["model"] = {k: v for k, v in plain["model"].items() if k in given or k == "img_size"}
    if plain["data"].get("name", "shapes") != "shapes":  # the sizes are shapes' own keys
        plain["data"] = {k: v for k, v in plain["data"].items() if (k, v) not in (("train_size", 256), ("val_size", 128))}
    return Config.from_dict(plain)


def composed(overrides: list[str], configs: Path | None = None) -> dict:
    """The config `vit-train OVERRIDES` composes, as plain data (before the typed schema's validation);
    from the config tree `configs` (a test's modified copy) instead of vit_train's when given."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from vit_train.cli.train import _config_dir  # also registers the schema node that train.yaml lists first

    with initialize_config_dir(config_dir=str(configs or _config_dir()), version_base="1.3"):
        return OmegaConf.to_container(compose("train", overrides=overrides), resolve=True)


def config_dir() -> Path:
    """vit_train's config folder (one folder a config group, train.yaml at its top)."""
    from vit_train.cli.train import _config_dir

    return Path(_config_dir())


def build_data(cfg: Config, device, rank: int = 0, world_size: int = 1, labels: bool = True):
    """The loaders a training process of `cfg` gets: its data set's `build` (vit_train/data/sources/)."""
    return cfg.data.build(cfg, device, rank, world_size, labels=labels)


def aug(name: str = "basic", **keys):
    """The augmentation option `name` (vit_train/data/aug/) with `keys` set."""
    from vit_train.schema.typed import option_class

    return option_class("aug", name)(**keys)
