"""Unreadable images (image folders): the policy (data.bad_images, data.max_bad_fraction) applied in
the training process, so that loaders hand out plain (images, targets) batches."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader

from vit_train.data.decoding.image import describe_unreadable
from vit_train.errors import DataError

log = logging.getLogger("vit_train")


class UnreadableImages:
    """Unreadable images met in one split: each logged once; `error` mode stops at the first, `skip`
    mode once more than `max_fraction` of the split is unreadable."""

    def __init__(self, base, split: str, mode: str, max_fraction: float):
        self.base, self.split, self.mode, self.max_fraction = base, split, mode, max_fraction
        self.seen: set[int] = set()
        self.replaced = 0  # replacements since the last report

    def check(self, unreadable: torch.Tensor) -> None:
        """Called with each batch's third item; cheap when every image was fine."""
        for index in unreadable[unreadable >= 0].tolist():
            path = self.base.samples[index][0]
            if self.split == "val":  # a replaced val image would be counted twice and its class less
                raise DataError(
                    f"val image {path} cannot be read ({self.why(index)}); every val image "
                    f"is evaluated, so fix or remove it (data.bad_images applies to training images)"
                )
            if self.mode == "error":
                raise DataError(
                    f"{path} cannot be read ({self.why(index)}); fix or remove "
                    f"it, or set data.bad_images=skip to replace unreadable images"
                )
            if index not in self.seen:
                self.seen.add(index)
                log.warning("unreadable %s image replaced: %s (%s)", self.split, path, self.why(index))
            self.replaced += 1
        if len(self.seen) > self.max_fraction * len(self.base):
            raise DataError(
                f"{len(self.seen)} of {len(self.base)} {self.split} images are unreadable, more than "
                f"data.max_bad_fraction={self.max_fraction}; first: {self.base.samples[min(self.seen)][0]}"
                f" (fix or remove them, or raise data.max_bad_fraction to train without them)"
            )

    def why(self, index: int) -> str:
        """Why image `index` cannot be read: the base's own words (a dataset cell, a tar member), else the file's."""
        describe = getattr(self.base, "describe_unreadable", None)
        return describe(index) if describe else describe_unreadable(self.base.samples[index][0])

    def report(self, epoch: int) -> None:
        if self.replaced:
            log.warning(
                "epoch %d: %d unreadable %s image%s replaced (%d distinct so far)",
                epoch,
                self.replaced,
                self.split,
                "" if self.replaced == 1 else "s",
                len(self.seen),
            )
            self.replaced = 0


class CheckedLoader:
    """A DataLoader over a TransformedDataset, whose batches are (images, labels, unreadable indices),
    as one of (images, labels): the unreadable indices are checked here, in the training process
    (where the policy's count and its log-once set live), not in a worker."""

    def __init__(self, loader: DataLoader, unreadable: UnreadableImages | None):
        self.loader, self.unreadable = loader, unreadable
        self.dataset = loader.dataset

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for images, labels, unreadable in self.loader:
            if self.unreadable is not None:
                self.unreadable.check(unreadable)
            yield images, labels
