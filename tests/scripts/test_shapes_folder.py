"""scripts/shapes_folder.py: the shapes generator's images as an image folder, pixel for pixel, each under its
class; data=imagefolder reads it back as the same images and labels; a folder in the way is refused in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from vit_train.data.sources.imagefolder_files import load_image_folders
from vit_train.data.sources.shapes import CLASS_NAMES, generate_shapes

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "shapes_folder.py"


def write(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": ""})


def test_the_folder_holds_the_generators_images_under_their_classes(tmp_path):
    done = write("shapes", "--train", "30", "--val", "10", "--size", "16", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"wrote 30 train and 10 val images of 10 classes at 16x16 under shapes\n"
    train, val, classes = load_image_folders(tmp_path / "shapes")
    assert classes == sorted(CLASS_NAMES)
    for split, count, seed in ((train, 30, 100), (val, 10, 101)):
        images, labels = generate_shapes(count, 16, seed)
        assert len(split.samples) == count
        for path, label in split.samples:
            index = int(Path(path).stem)
            assert classes[label] == CLASS_NAMES[int(labels[index])]
            assert np.array_equal(np.array(Image.open(path)), images[index].permute(1, 2, 0).numpy())


def test_a_folder_in_the_way_is_refused(tmp_path):
    (tmp_path / "shapes").mkdir()
    (tmp_path / "shapes" / "mine.txt").write_text("")
    done = write("shapes", cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.splitlines()[-1] == (
        "shapes_folder.py: error: shapes exists and is not an empty folder: give another DIR, or remove it")
    assert sorted(os.listdir(tmp_path / "shapes")) == ["mine.txt"]
