"""The registry of options kept around a test that registers options of its own (`registry_kept`)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from vit_train.schema.typed import REGISTRY, registered


@contextmanager
def registry_kept() -> Iterator[dict[str, dict[str, type]]]:
    """{group: {name: class}} as it is before the block, every module of the options imported first (a copy taken
    before the registry's first lookup would hold none of them), put back after it: the options the block
    registered are gone again."""
    saved = registered()
    try:
        yield saved
    finally:
        REGISTRY.clear()
        REGISTRY.update({group: dict(found) for group, found in saved.items()})
