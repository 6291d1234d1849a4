"""data=imagefolder: ImageNet-style folders, root/train/<class>/* and root/val/<class>/*, classes named by train/
(read by imagefolder_files.py)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from vit_train.data.sources.base import EncodedImages


@dataclass
class ImageFolders(EncodedImages):
    """data=imagefolder: root/train/<class>/* and root/val/<class>/*, classes named by train/; images of any
    mode and size, converted to RGB (decoding/image.py). Read without labels (objective=mae), any folder of images."""

    root_hint = "a folder holding train/<class>/* and val/<class>/*; add data.root=/path/to/images"

    name: str = "imagefolder"

    def splits(self, img_size: int, labels: bool = True) -> tuple:
        from vit_train.data.sources.imagefolder_files import load_image_folders, load_unlabelled_folders

        read = load_image_folders if labels else load_unlabelled_folders  # without labels any folder of images
        return (*read(self.given_root()), None)

    def read_folders(self) -> list[Path]:
        root = Path(os.path.realpath(Path(self.given_root()).expanduser()))
        return [root / "train", root / "val"]
