"""What a data set's `splits()` returns is checked before the loaders are made (data/sources/base.py
`check_splits`): a data set of the user's own that returns something else is one line naming data=NAME, what came
back and the contract, not a traceback from deep in the loader (or, worse, a run on wrong labels)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from helpers.configs import tiny_config
from helpers.registry import registry_kept
from vit_train.data.datasets import TensorImages
from vit_train.data.sources.base import SPLITS_CONTRACT, DataSource, check_splits
from vit_train.errors import DataError

IMAGES = torch.zeros(4, 3, 8, 8, dtype=torch.uint8)
GOOD = TensorImages(IMAGES, torch.tensor([0, 1, 0, 1]))
NAMES = ["a", "b"]


class Items:
    """A Dataset of the given items (len and [i])."""

    def __init__(self, *items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


WRONG = {  # what splits() returned -> what the line says came back
    "three parts": ((GOOD, GOOD, NAMES), "a tuple of 3"),
    "a dict": ({"train": GOOD, "val": GOOD}, "a dict"),
    "a class count": ((GOOD, GOOD, 2, None), "class names as a int (2) (for 2 classes: [str(i) for i in range(2)])"),
    "one string of names": ((GOOD, GOOD, "ab", None), "class names as a str ('ab')"),
    "no class names": ((GOOD, GOOD, [], None), "no class names"),
    "numbers as names": ((GOOD, GOOD, [0, 1], None), "a class name that is a int (0)"),
    "a float side": ((GOOD, GOOD, NAMES, 8.0), "8.0 as the images' native side (pixels)"),
    "a string side": ((GOOD, GOOD, NAMES, "8"), "'8' as the images' native side (pixels)"),
    "a zero side": ((GOOD, GOOD, NAMES, 0), "0 as the images' native side (pixels)"),
    "a generator": (((x for x in [1]), GOOD, NAMES, None), "a generator as the train set, which has no len() and [i]"),
    "an empty val set": ((GOOD, Items(), NAMES, None), "an empty val set"),
    "dict items (as Hugging Face's)": ((Items({"image": IMAGES[0], "label": 0}), GOOD, NAMES, None),
                                       "train items that are a dict with keys ['image', 'label'], not an (image, "
                                       "label) pair"),
    "a bare image": ((GOOD, Items(IMAGES[0]), NAMES, None), "val items that are a Tensor, not an (image, label) pair"),
    "a class name as the label": ((Items((IMAGES[0], "a")), GOOD, NAMES, None),
                                  "train[0]'s label 'a', not an integer index into the 2 class names"),
    "a label past the names": ((GOOD, Items((IMAGES[0], 2)), NAMES, None),
                               "val[0]'s label 2, not an integer index into the 2 class names"),
    "a float label": ((Items((IMAGES[0], 1.0)), GOOD, NAMES, None),
                      "train[0]'s label 1.0, not an integer index into the 2 class names"),
    "a negative label": ((Items((IMAGES[0], -1)), GOOD, NAMES, None),
                         "train[0]'s label -1, not an integer index into the 2 class names"),
}


@pytest.mark.parametrize("case", list(WRONG))
def test_what_splits_returned_is_named_in_one_line(case):
    found, said = WRONG[case]
    with pytest.raises(DataError) as caught:
        check_splits(found, "data=mine")
    assert str(caught.value) == f"data=mine: splits() returned {said}; it must return {SPLITS_CONTRACT}"


RIGHT = {
    "tensor images": (GOOD, GOOD, NAMES, 8),
    "a list of pairs and a tuple of names": ([(IMAGES[0], 1)], [(IMAGES[1], 0)], ("a", "b"), None),
    "numpy labels": (Items((IMAGES[0], np.int64(1))), Items((IMAGES[0], np.uint8(0))), NAMES, None),
    "0-d tensor labels": (Items((IMAGES[0], torch.tensor(1))), GOOD, NAMES, None),
}


@pytest.mark.parametrize("case", list(RIGHT))
def test_what_the_contract_allows_passes(case):
    check_splits(RIGHT[case], "data=mine")


def test_unlabelled_items_pass_when_the_objective_reads_no_labels():
    unlabelled = Items((IMAGES[0], None))
    check_splits((unlabelled, unlabelled, ["image"], None), "data=mine", labels=False)
    with pytest.raises(DataError, match=r"label None, not an integer index"):
        check_splits((unlabelled, unlabelled, ["image"], None), "data=mine")


def test_a_run_on_a_data_set_returning_three_parts_stops_in_one_line_before_writing_a_checkpoint(tmp_path):
    with registry_kept():

        @dataclass
        class ThreeParts(DataSource):
            name: str = "three_parts"

            def splits(self, img_size: int, labels: bool = True):
                images = TensorImages(torch.zeros(32, 3, img_size, img_size, dtype=torch.uint8), torch.zeros(32).long())
                return images, images, ["x"]

        from vit_train.train.trainer import train

        cfg = tiny_config(data={"name": "three_parts", "batch_size": 16}, model={"img_size": 16})
        with pytest.raises(DataError, match=r"^data=three_parts: splits\(\) returned a tuple of 3; it must return"):
            train(cfg, tmp_path / "run")
    assert not (tmp_path / "run" / "checkpoints").exists() or not any((tmp_path / "run" / "checkpoints").iterdir())
