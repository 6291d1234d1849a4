"""trainer.limit_val_batches: an evaluation over the first batches of the val loader only (Lightning's
`limit_val_batches`), e.g. trainer=debug's, which must not spend its time on the whole val set."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sized
from typing import Any


class FirstBatches:
    """The first `limit` batches of `loader` (every batch when `limit` is None or not below the
    loader's length), counting the images they hold in `images` (this process's share).

    A loader's batches are (images, labels); `partial` says whether batches were left out.
    """

    def __init__(self, loader: Sized, limit: int | None):
        self.loader, self.total = loader, len(loader)
        self.limit = self.total if limit is None else min(limit, self.total)
        self.images = 0

    @property
    def partial(self) -> bool:
        return self.limit < self.total

    def __len__(self) -> int:
        return self.limit

    def __iter__(self) -> Iterator[Any]:
        self.images = 0
        # the whole loader runs to its end, as before; a cut one's workers stop with its iterator
        for batch in itertools.islice(self.loader, self.limit) if self.partial else self.loader:
            self.images += len(batch[1])
            yield batch
