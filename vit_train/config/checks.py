"""The combinations a run config must satisfy, checked before any work starts (no torch import).

`Config.validate` (schema.py) calls `check_config`; this module reads a Config's fields and does
not import the schema, so the two are not an import circle.
"""

from __future__ import annotations

from vit_train.errors import ConfigError

# Image side and patch side a model gets when model.img_size / model.patch_size are null. The command
# line never leaves them null: each configs/data/*.yaml sets them from configs/data/input_size/, where
# `vit-train --cfg job` shows them; this table fills a Config built in Python (Config(), from_dict)
# the same way (tests/test_input_sizes.py keeps the two equal).
DATASET_DEFAULTS: dict[str, tuple[int, int]] = {
    "shapes": (32, 4),
    "cifar10": (32, 4),
    "cifar100": (32, 4),
    "imagefolder": (224, 16),
    "webdataset": (224, 16),
    "hf": (224, 16),
}

LOSSES = ("best_loss", "final_loss")  # sweep.objective values that are minimised


def check_config(cfg) -> None:
    """`cfg`: a Config (schema.py). Fill the data set's defaults for model.img_size/patch_size, then refuse what cannot run.

    Raises ConfigError naming the key, the value and what to change.
    """
    fill_input_size(cfg)
    m, d, t = cfg.model, cfg.data, cfg.trainer
    _positive(
        ("model.img_size", m.img_size), ("model.patch_size", m.patch_size),
        ("model.embed_dim", m.embed_dim), ("model.depth", m.depth),
        ("model.num_heads", m.num_heads), ("model.mlp_ratio", m.mlp_ratio),
        ("data.batch_size", d.batch_size), ("data.train_size", d.train_size),
        ("data.val_size", d.val_size), ("optim.lr", cfg.optim.lr),
        ("trainer.epochs", t.epochs), ("trainer.accum_steps", t.accum_steps),
        ("trainer.log_every", t.log_every), ("trainer.keep_last", t.keep_last),
        ("trainer.max_bad_steps", t.max_bad_steps), ("data.repeated_aug", d.repeated_aug),
    )
    _require(t.ema_decay is None or 0.0 < t.ema_decay < 1.0, f"trainer.ema_decay must be in (0, 1), got {t.ema_decay}")
    _require(not (t.strategy == "fsdp" and t.precision == "fp16"), "trainer.strategy=fsdp does not take "
             "trainer.precision=fp16 (its GradScaler cannot see sharded gradients); use bf16 or fp32")
    for key, value in (("data.eval_batch_size", d.eval_batch_size), ("trainer.max_steps", t.max_steps),
                       ("trainer.eval_every", t.eval_every), ("trainer.ckpt_every", t.ckpt_every), ("trainer.viz_every", t.viz_every),
                       ("trainer.cpu_threads", t.cpu_threads), ("trainer.limit_val_batches", t.limit_val_batches),
                       ("sweep.devices", cfg.sweep.devices),
                       ("optim.clip_grad", cfg.optim.clip_grad), ("optim.lr_base_batch", cfg.optim.lr_base_batch)):
        if value is not None:
            _positive((key, value))
    _require(m.img_size % m.patch_size == 0, f"model.img_size ({m.img_size}) must be divisible by "
             f"model.patch_size ({m.patch_size})")
    _require(m.embed_dim % m.num_heads == 0, f"model.embed_dim ({m.embed_dim}) must be divisible by "
             f"model.num_heads ({m.num_heads})")
    _require(m.reg_tokens >= 0, f"model.reg_tokens must be >= 0, got {m.reg_tokens}")
    if m.arch != "vit":
        vit_only = [k for k, v in (("model.trainable=head", m.trainable == "head"), ("model.distilled", m.distilled),
                                   ("optim.layer_decay", cfg.optim.layer_decay is not None)) if v]
        _require(not vit_only, f"{', '.join(vit_only)} is for ViTs; model.arch={m.arch} does not support it")
    _require(m.init_values is None or m.init_values > 0,
             f"model.init_values must be > 0 (LayerScale's initial scale, e.g. 1e-5) or null for none, got {m.init_values}")
    _require(m.pos_embed != "sincos2d" or m.embed_dim % 4 == 0,
             f"model.pos_embed=sincos2d needs model.embed_dim divisible by 4, got {m.embed_dim}")
    for key, value in (("model.dropout", m.dropout), ("model.attn_dropout", m.attn_dropout),
                       ("model.drop_path", m.drop_path), ("aug.label_smoothing", cfg.aug.label_smoothing)):
        _require(0.0 <= value < 1.0, f"{key} must be in [0, 1), got {value}")
    _check_aug(cfg)
    # mae.* is checked by objectives/mae.py's check, only when objective=mae: a classify run never reads it
    _require(cfg.sweep.objective not in LOSSES or cfg.sweep.direction == "minimize",
             f"sweep.objective={cfg.sweep.objective} is a loss: lower is better, so add sweep.direction=minimize")
    _require(0.0 <= cfg.distill.alpha <= 1.0, f"distill.alpha must be in [0, 1], got {cfg.distill.alpha}")
    _require(cfg.distill.tau > 0, f"distill.tau must be > 0, got {cfg.distill.tau}")
    _require(0.0 <= d.max_bad_fraction <= 1.0, f"data.max_bad_fraction must be in [0, 1], got {d.max_bad_fraction}")
    _require(d.num_workers is None or d.num_workers >= 0, f"data.num_workers must be >= 0, got {d.num_workers}")
    _require(d.batch_size % t.accum_steps == 0, f"data.batch_size ({d.batch_size}) must be divisible "
             f"by trainer.accum_steps ({t.accum_steps})")
    _require(d.name != "imagefolder" or bool(d.root),
             "data=imagefolder needs data.root, a folder holding train/<class>/* and val/<class>/*; "
             "add data.root=/path/to/images")
    _require(d.name != "webdataset" or bool(d.root),
             "data=webdataset needs data.root, the folder holding index.json (vit-shards writes it) and, unless "
             "data.train_shards/val_shards say where they are, the shards; add data.root=/path/to/shards")
    _require(d.name != "hf" or bool(d.root),
             "data=hf needs data.root, a Hugging Face dataset on disk (a save_to_disk folder or a folder of parquet "
             "files); add data.root=/path/to/dataset")
    _require(d.shuffle_buffer >= 1, f"data.shuffle_buffer must be >= 1 (1 = no shuffle buffer), got {d.shuffle_buffer}")
    _require(cfg.optim.layer_decay is None or 0 < cfg.optim.layer_decay <= 1,
             f"optim.layer_decay must be in (0, 1] (e.g. 0.75 for fine-tuning) or null for off, got {cfg.optim.layer_decay}")
    _require(cfg.optim.weight_decay >= 0, f"optim.weight_decay must be >= 0, got {cfg.optim.weight_decay}")
    _require(len(cfg.optim.betas) == 2, f"optim.betas must have two values, got {cfg.optim.betas}")
    _require(cfg.schedule.warmup_epochs >= 0,
             f"schedule.warmup_epochs must be >= 0, got {cfg.schedule.warmup_epochs}")
    _require(cfg.schedule.name != "cosine" or 0 <= cfg.schedule.min_lr <= cfg.lr, f"schedule.min_lr ({cfg.schedule.min_lr}) must be "
             f"between 0 and optim.lr ({cfg.lr:g}{' after batch scaling' if cfg.optim.lr_base_batch else ''})")


def fill_input_size(cfg) -> None:
    """Set model.img_size and model.patch_size (pixels) that are null to data.name's DATASET_DEFAULTS, in place."""
    m = cfg.model
    default_img, default_patch = DATASET_DEFAULTS[cfg.data.name]
    m.img_size = default_img if m.img_size is None else m.img_size
    m.patch_size = default_patch if m.patch_size is None else m.patch_size


def _check_aug(cfg) -> None:
    a = cfg.aug
    for key, value in (("aug.hflip", a.hflip), ("aug.mix_prob", a.mix_prob), ("aug.switch_prob", a.switch_prob),
                       ("aug.random_erasing", a.random_erasing)):
        _require(0.0 <= value <= 1.0, f"{key} must be in [0, 1], got {value}")
    _require(0.0 < a.scale_min <= 1.0, f"aug.scale_min must be in (0, 1], got {a.scale_min}")
    _require(a.mixup_alpha >= 0 and a.cutmix_alpha >= 0, f"aug.mixup_alpha and aug.cutmix_alpha must be >= 0 "
             f"(0 = off), got {a.mixup_alpha} and {a.cutmix_alpha}")
    _require(0 <= a.randaug_m <= 30, f"aug.randaug_m must be in [0, 30], got {a.randaug_m}")
    _require(a.randaug_n >= 0, f"aug.randaug_n must be >= 0, got {a.randaug_n}")


def _positive(*pairs: tuple[str, float]) -> None:
    for key, value in pairs:
        _require(value > 0, f"{key} must be > 0, got {value}")


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)
