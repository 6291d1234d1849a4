"""data=webdataset: tar shards read as streams (data/shards/stream.py), in an order that is a pure function of
the run (data/shards/order.py), resumed exactly in the middle of an epoch without decoding what was already
trained on. This module is the option: its keys, its loaders, and what a resume in the middle of an epoch
may not change (the stream's layout, kept in the checkpoint).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vit_train.data.aug.base import Augmentation
from vit_train.data.sources.base import EncodedImages
from vit_train.errors import ConfigError
from vit_train.schema.typed import require

if TYPE_CHECKING:
    import torch

    from vit_train.data.loaders import Data
    from vit_train.schema.config import Config
    from vit_train.schema.sections import RunConfig


@dataclass
class WebDataset(EncodedImages):
    """data=webdataset: tar shards (vit-shards writes them) with samples key.jpg|png|webp + key.cls, listed in
    data.root/index.json; the shards are in data.root unless data.train_shards / data.val_shards give brace
    URLs or pipe: commands. Needs the data extra: pip install 'vit-train[data]'."""

    root_hint = (
        "the folder holding index.json (vit-shards writes it) and, unless data.train_shards/val_shards say "
        "where they are, the shards; add data.root=/path/to/shards"
    )

    name: str = "webdataset"
    train_shards: str | None = None  # brace URL or pipe: command of the train shards; null = data.root
    val_shards: str | None = None  # the same for the val shards
    shuffle_buffer: int = 5000  # samples in each loader worker's shuffle buffer (OpenCLIP's 5000)

    def check(self, cfg: RunConfig) -> None:
        super().check(cfg)
        require(
            self.shuffle_buffer >= 1,
            f"data.shuffle_buffer must be >= 1 (1 = no shuffle buffer), got {self.shuffle_buffer}",
        )

    def build(self, cfg: Config, device: torch.device, rank: int = 0, world_size: int = 1, labels: bool = True) -> Data:
        """Shards read as streams in a planned order: each (process, worker) its slot of the epoch's plan."""
        from vit_train.data.device.files import device_decoding
        from vit_train.data.loaders import Data, loader_options, pipeline, reads_patch_size, small_images
        from vit_train.data.shards.index import load_index
        from vit_train.data.shards.stream import build_stream_loaders
        from vit_train.data.transforms import build_transforms

        pipeline(cfg, device)  # refuses data.pipeline=device
        if self.repeated_aug > 1:  # its copies must land in one global batch: a stream cannot place them
            raise ConfigError(
                f"data.repeated_aug={self.repeated_aug} works with random-access data sets only, not "
                f"data=webdataset (a stream cannot repeat a sample inside one batch); use "
                f"data.repeated_aug=1"
            )
        index = load_index(self.given_root(), self.train_shards, self.val_shards)
        aug, img_size = cfg.aug, cfg.model.img_size
        assert isinstance(aug, Augmentation) and img_size is not None  # every aug option is one; validate filled it
        train_tf, eval_tf = build_transforms(aug, img_size, self.stats, None)
        options = loader_options(self.num_workers, device)
        decoding = device_decoding(cfg, device, rank)  # data.decode=gpu: decoded on the device (device/files.py)
        train, val, plan, unreadable = build_stream_loaders(
            index, cfg, train_tf, eval_tf, device, rank, world_size, labels, options, decoding
        )
        sizes = (
            [(index.image_size[1], index.image_size[0])] if index.image_size else []
        )  # [H, W] when every image has one size
        small = small_images(sizes, img_size, reads_patch_size(cfg), "every image, as index.json records")
        stored = stored_too_small(
            index,
            train_side(train_tf, img_size, aug.name),
            (eval_tf.resize, f"evaluation's resize to {eval_tf.resize} (then the centre crop to {cfg.model.img_size})"),
        )
        left = index.train.samples % self.batch_size
        tail = (
            (
                f"data=webdataset: the train split is one shard ({index.train.shards[0]}), so the {left} samples past "
                f"its last whole batch of {self.batch_size}, its last {left}, are left out every epoch and never "
                f"trained on; write it in several shards (vit-shards shard_size=N: the epoch's last shard, whose tail "
                f"is left out, changes every epoch) or use a data.batch_size that divides {index.train.samples}"
            )
            if left and len(index.train.shards) == 1
            else None
        )
        return Data(
            train,
            val,
            plan,
            list(index.classes),
            index.train.samples // self.batch_size,
            self.stats,
            unreadable,
            tuple(line for line in (small, stored, tail) if line),
            None if decoding is None else train.decoder,
        )

    def stream_layout(self, world_size: int) -> dict[str, Any]:
        """The world size and loader worker count (data.num_workers resolved) the epoch's stream plan is cut for
        (data/shards/order.py), and the fingerprint of the index's training shards and classes (train_index,
        when the index can be read)."""
        from vit_train.data.loaders import loader_workers
        from vit_train.data.shards.index import train_fingerprint

        layout = {"world_size": world_size, "loader_workers": max(1, loader_workers(self.num_workers))}
        fingerprint = train_fingerprint(self.given_root())
        return layout if fingerprint is None else {**layout, "train_index": fingerprint}

    def position_changes(self, saved: dict, layout: dict | None, world_size: int) -> list[str]:
        """What the epoch's stream plan depends on and a resume in its middle changed: the number of processes,
        of loader workers, data.batch_size, data.shuffle_buffer (each cuts or shuffles the stream otherwise),
        the index's training shards (names, sample counts: the same total in another layout is another stream)
        or classes."""
        if saved.get("name") != self.name:
            return []
        was, now = layout or {}, self.stream_layout(world_size)
        changed = [
            f"{what} is {now[key]}, not {was[key]}"
            for key, what in (
                ("world_size", "the number of processes"),
                ("loader_workers", "the loader worker count (data.num_workers, 0 counting as 1)"),
            )
            if key in was and now[key] != was[key]
        ]
        for key in ("batch_size", "shuffle_buffer"):
            before, after = saved.get(key), getattr(self, key)
            if before is not None and before != after:
                changed.append(f"data.{key} is {after}, not {before}")
        if "train_index" in was and now.get("train_index") != was["train_index"]:
            changed.append(
                f"the training shards of {self.root} are not those the epoch began with (index.json lists "
                f"other shard names, sample counts or classes: fingerprint {now.get('train_index')}, not "
                f"{was['train_index']}; put those shards back)"
            )
        return changed

    def check_shardable(self) -> None:
        raise ConfigError(
            "data=webdataset is shards already; vit-shards writes them from the other data sets (to "
            "re-shard, write from the data set they came from)"
        )


def train_side(train_tf: Any, img_size: int, aug: str) -> tuple[int, str]:
    """(the shorter side, in pixels, that the training transform reads each image at, what it is): a Resize's
    side where the option resizes (aug=none resizes and centre-crops as evaluation does), else the crop's
    model.img_size (RandomResizedCrop: the largest crop is the whole image resized to it)."""
    from torchvision.transforms import v2

    sides = [
        s if isinstance(s, int) else s[0]
        for t in train_tf.transforms
        if isinstance(t, v2.Resize)
        for s in [t.size]
        if s
    ]
    if sides and max(sides) > img_size:
        return max(sides), f"training's resize to {max(sides)} (aug={aug}, then the centre crop to {img_size})"
    return img_size, f"a training crop of model.img_size={img_size}"


def stored_too_small(index: Any, train: tuple[int, str], val: tuple[int, str]) -> str | None:
    """One line when pre-resized shards (vit-shards short_side=N, index.json's splits.*.short_side) hold fewer
    pixels than the run reads them at: `train` and `val` are (the shorter side each split's transform reads an
    image at, what that is): training's crop or resize, evaluation's resize (then the centre crop). None when the
    stored sides suffice or the images are stored at their size."""
    needs = [
        (split, side, need, what)
        for split, (need, what) in ((index.train, train), (index.val, val))
        if (side := split.short_side) is not None and side < need
    ]
    if not needs:
        return None
    said = "; ".join(
        f"the {split.name} shards hold images of a shorter side of at most {side} px, less than {what}"
        for split, side, need, what in needs
    )
    return (
        f"data=webdataset: {said}, so those images are upscaled from fewer pixels than the source had; write "
        f"the shards again with vit-shards short_side={max(need for _, _, need, _ in needs)} or more (or none)"
    )
