"""Keys that the chosen group options ignore (momentum with AdamW, randaug_m with aug=autoaug, ...).

Every key of a section can be set whatever option is chosen (the typed schema gives them all a
default), so a value that has no effect would otherwise pass in silence. `ignored_keys` lists the
ones the user changed (a value other than the schema's default, or named on the command line) and
the run logs one warning line for each. No torch here.
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping

from vit_train.config.schema import IMAGE_FILES, Config

O, S, A, D = "optim={c.optim.name}", "schedule={c.schedule.name}", "aug={c.aug.name}", "data={c.data.name}"
AD = "aug={c.aug.name}, data={c.data.name}"
MIX = "aug.mixup_alpha={c.aug.mixup_alpha}, aug.cutmix_alpha={c.aug.cutmix_alpha}"
# key -> (is it ignored by this config?, the choice that ignores it, which settings use it)
RULES: dict[str, tuple[Callable[[Config], bool], str, str]] = {
    "optim.momentum": (lambda c: c.optim.name != "sgd", O, "optim=sgd"),
    "optim.betas": (lambda c: c.optim.name != "adamw", O, "optim=adamw"),
    "optim.eps": (lambda c: c.optim.name != "adamw", O, "optim=adamw"),
    "schedule.min_lr": (lambda c: c.schedule.name != "cosine", S, "schedule=cosine"),
    "aug.randaug_n": (lambda c: c.aug.name not in ("randaug", "deit"), A, "aug=randaug and aug=deit"),
    "aug.randaug_m": (lambda c: c.aug.name not in ("randaug", "deit"), A, "aug=randaug and aug=deit"),
    "aug.autoaug_policy": (lambda c: c.aug.name != "autoaug", A, "aug=autoaug"),
    "aug.hflip": (lambda c: c.aug.name == "none", A, "every aug option but none"),
    "aug.crop_padding": (lambda c: c.aug.name == "none" or c.data.name in IMAGE_FILES, AD,
                         "shapes and CIFAR with an aug option other than none"),
    "aug.scale_min": (lambda c: c.aug.name == "none" or c.data.name not in IMAGE_FILES, AD,
                      "data=imagefolder, webdataset and hf with an aug option other than none"),
    "aug.mix_prob": (lambda c: c.aug.mixup_alpha == 0 and c.aug.cutmix_alpha == 0, MIX,
                     "aug.mixup_alpha > 0 or aug.cutmix_alpha > 0"),
    "aug.switch_prob": (lambda c: c.aug.mixup_alpha == 0 or c.aug.cutmix_alpha == 0, MIX,
                        "aug.mixup_alpha > 0 together with aug.cutmix_alpha > 0"),
    "data.root": (lambda c: c.data.name == "shapes", D, "data=cifar10, cifar100, imagefolder, webdataset and hf"),
    "data.download": (lambda c: not c.data.name.startswith("cifar"), D, "data=cifar10 and cifar100"),
    "data.train_size": (lambda c: c.data.name != "shapes", D, "data=shapes"),
    "data.val_size": (lambda c: c.data.name != "shapes", D, "data=shapes"),
    "data.seed": (lambda c: c.data.name != "shapes", D, "data=shapes"),
    "data.bad_images": (lambda c: c.data.name not in IMAGE_FILES, D, "data=imagefolder, webdataset and hf"),
    "data.max_bad_fraction": (lambda c: c.data.name not in IMAGE_FILES, D, "data=imagefolder, webdataset and hf"),
    "data.train_shards": (lambda c: c.data.name != "webdataset", D, "data=webdataset"),
    "data.val_shards": (lambda c: c.data.name != "webdataset", D, "data=webdataset"),
    "data.shuffle_buffer": (lambda c: c.data.name != "webdataset", D, "data=webdataset"),
    "data.image_key": (lambda c: c.data.name != "hf", D, "data=hf"),
    "data.label_key": (lambda c: c.data.name != "hf", D, "data=hf"),
    "data.train_split": (lambda c: c.data.name != "hf", D, "data=hf"),
    "data.val_split": (lambda c: c.data.name != "hf", D, "data=hf"),
    "trainer.compile_mode": (lambda c: not c.trainer.compile, "trainer.compile=false", "trainer.compile=true"),
    "trainer.fsdp_reshard_after_forward": (lambda c: c.trainer.strategy != "fsdp", "trainer.strategy={c.trainer.strategy}",
                                           "trainer.strategy=fsdp"),
}
VIT_ONLY = ("embed_dim", "depth", "num_heads", "mlp_ratio", "qkv_bias", "pool", "pos_embed", "dropout", "attn_dropout",
            "drop_path", "reg_tokens", "init_values", "qk_norm", "grad_checkpointing")  # keys a ResNet (model.arch=resnet*) has no use for
RULES.update({f"model.{key}": (lambda c: c.model.arch != "vit", "model.arch={c.model.arch}", "ViTs (model.arch=vit)")
              for key in VIT_ONLY})


def _value(plain: dict, key: str) -> object:
    section, leaf = key.split(".")
    return plain[section][leaf]


def ignored_keys(cfg: Config, named: Iterable[str] = (), unread: Mapping[str, str] | None = None) -> list[str]:
    """One warning line per key that `cfg`'s options ignore and that was changed from the schema's
    default or named in `named` (dotted keys from the command line). `unread`: {section: the choice
    that reads it} for whole sections this config does not read, e.g. the sections another objective
    owns (vit_train/objectives: `ignored_keys` there passes its own)."""
    plain, default = cfg.to_dict(), Config().to_dict()
    named = set(named)
    lines = []
    rules = dict(RULES)
    for section, users in (unread or {}).items():
        rules.update({f"{section}.{key}": (lambda c: True, "objective={c.objective.name}", users)
                      for key in plain[section]})
    for key, (ignored, choice, users) in rules.items():
        value = _value(plain, key)
        if (key in named or value != _value(default, key)) and ignored(cfg):
            lines.append(f"{key}={value} has no effect with {choice.format(c=cfg)}; it applies only to {users}")
    return lines


def override_keys(overrides: Iterable[str]) -> list[str]:
    """The dotted keys that `key=value` command-line overrides set."""
    return [o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o and not o.startswith("-")]
