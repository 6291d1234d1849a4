"""Data folders read only regular files (issue 23): a FIFO, socket or device named like an image, a
broken link, a symlink loop and a folder named like an image are skipped in one warning line, never a
hang (a FIFO blocks whoever opens it) and never a duplicate; vit-predict refuses a named FIFO in one line."""

import logging
import os
from pathlib import Path

import pytest

from helpers.configs import TINY_MODEL
from helpers.images import write_image, write_image_folder
from helpers.runs import command, vit_train
from helpers.special_files import make_socket
from vit_train.data.sources.imagefolder_files import load_image_folders, load_unlabelled_folders
from vit_train.data.decoding.listing import list_images
from vit_train.errors import DataError
from vit_train.tools.predict import image_files

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs and sockets are POSIX")


def plant_specials(folder: Path) -> list[str]:
    """Special entries in `folder`, each named like an image, and the loop links; returns their names."""
    os.mkfifo(folder / "fifo.png")
    make_socket(folder / "sock.jpg")
    (folder / "broken.png").symlink_to(folder / "gone.png")
    (folder / "self.png").symlink_to(folder / "self.png")  # ELOOP on stat
    (folder / "loop").symlink_to("..")  # the class folder's parent: the split
    (folder / "up").symlink_to(".")  # the folder itself
    write_image(folder / "folder.png" / "inner.png", "RGB", (20, 20))  # a folder named like an image: read as one
    return ["broken.png", "fifo.png", "loop", "self.png", "sock.jpg", "up"]


def test_the_listing_keeps_regular_files_once_and_names_what_it_skipped(tmp_path):
    write_image_folder(tmp_path, {"train": 3}, classes=("red", "blue"))
    red = tmp_path / "train" / "red"
    plant_specials(red)
    (red / "dev.png").symlink_to("/dev/null")  # a character device, through a link
    (tmp_path / "train" / "blue" / "red").symlink_to("../red")  # another class's folder, linked: read there too
    files, skipped = list_images(tmp_path / "train")
    train = str(tmp_path / "train")
    assert files == [f"{train}/blue/{i}.png" for i in range(3)] + [f"{train}/red/{i}.png" for i in range(3)] + \
        [f"{train}/red/folder.png/inner.png"]  # blue/red/ is red/: read once, where the walk met it first
    assert skipped == ["blue/red/ (a link to a folder read already or above it)", "red/broken.png (a broken link)",
                       "red/dev.png (a character device)", "red/fifo.png (a FIFO)",
                       "red/loop/ (a link to a folder read already or above it)",
                       "red/self.png (a link loop)", "red/sock.jpg (a socket)",
                       "red/up/ (a link to a folder read already or above it)"]
    only_here, _ = list_images(red, recursive=False)
    assert only_here == [f"{red}/{i}.png" for i in range(3)]


def test_an_image_folder_with_special_files_and_a_loop_gives_each_image_once_with_its_label(tmp_path, caplog):
    write_image_folder(tmp_path, {"train": 24, "val": 2}, classes=("blue", "red"))  # 48 train images
    plant_specials(tmp_path / "train" / "red")
    (tmp_path / "train" / "blue" / "far").symlink_to(tmp_path)  # a link to data.root, above the split
    with caplog.at_level(logging.WARNING, logger="vit_train"):
        train, val, classes = load_image_folders(tmp_path)
    assert classes == ["blue", "red"]
    root = tmp_path / "train"
    expected = [(f"{root}/blue/{i}.png", 0) for i in sorted(range(24), key=str)] + \
        [(f"{root}/red/{i}.png", 1) for i in sorted(range(24), key=str)] + [(f"{root}/red/folder.png/inner.png", 1)]
    assert sorted(train.samples) == sorted(expected) and len(train) == 49  # not 1,968: no duplicate, no mislabel
    lines = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith(f"{root}: skipped 7 entries that cannot be read as image files: ")
    assert [train[i][1] for i in range(len(train))] == [t for _, t in train.samples]  # every sample opens, no hang


def test_a_class_of_only_special_files_is_named_as_holding_no_images(tmp_path):
    write_image_folder(tmp_path, {"train": 2, "val": 1}, classes=("blue", "red"))
    for image in (tmp_path / "train" / "red").iterdir():
        image.unlink()
    os.mkfifo(tmp_path / "train" / "red" / "x.png")
    with pytest.raises(DataError, match=r"class folder\(s\) with no images in .*train: red \(.*not regular files"):
        load_image_folders(tmp_path)


def test_unlabelled_images_skip_special_files_and_loops(tmp_path):
    write_image_folder(tmp_path, {"train": 2, "val": 1}, classes=("a",))
    plant_specials(tmp_path / "train" / "a")
    train, val, _ = load_unlabelled_folders(tmp_path)
    assert [p for p, _ in train.samples] == [str(tmp_path / "train" / "a" / n) for n in ("0.png", "1.png")] + \
        [str(tmp_path / "train" / "a" / "folder.png" / "inner.png")]
    assert len(val) == 1


def test_vit_predict_refuses_a_named_fifo_and_skips_one_in_a_folder_or_pattern(tmp_path):
    photos = tmp_path / "photos"
    write_image(photos / "a.png", "RGB", (20, 20))
    plant_specials(photos)
    with pytest.raises(DataError, match=r"^images: .*fifo\.png is a FIFO, not a regular file; give image files"):
        image_files([str(photos / "fifo.png")])
    assert image_files([str(photos)]) == [str(photos / "a.png")]
    assert image_files([f"{photos}/**/*.png"]) == [str(photos / "a.png"), str(photos / "folder.png" / "inner.png")]
    with pytest.raises(DataError, match=r"^images: the pattern .*\*\.jpg' matches no image file"):
        image_files([f"{photos}/*.jpg"])  # only the socket


def test_a_pattern_matching_only_special_files_is_one_line(tmp_path):
    os.mkfifo(tmp_path / "x.png")
    with pytest.raises(DataError, match=r"^images: the pattern .* matches no image file"):
        image_files([f"{tmp_path}/*.png"])


@pytest.mark.slow  # ~20 s on 2 cores: training and vit-predict in subprocesses, loader workers on
def test_training_and_predict_through_the_commands_never_hang_on_a_fifo(tmp_path):
    write_image_folder(tmp_path / "data", {"train": 8, "val": 2}, classes=("blue", "red"))
    plant_specials(tmp_path / "data" / "train" / "red")
    os.mkfifo(tmp_path / "data" / "val" / "blue" / "v.png")
    run_dir = tmp_path / "run"
    done = vit_train(*TINY_MODEL, "data=imagefolder", f"data.root={tmp_path / 'data'}", "data.num_workers=1",
                     "data.batch_size=8", "trainer.max_steps=2", f"hydra.run.dir={run_dir}",
                     cwd=tmp_path)  # the helper's timeout: 300 s
    assert done.returncode == 0, done.stderr
    assert "train: skipped 6 entries that cannot be read as image files" in done.stdout
    assert "val: skipped 1 entry that cannot be read as image files: blue/v.png (a FIFO)" in done.stdout
    predicted = command("predict", f"ckpt={run_dir}", f"images=[{tmp_path / 'data' / 'val' / 'blue' / 'v.png'}]")
    assert predicted.returncode == 2 and predicted.stderr.count("\n") == 1
    assert "v.png is a FIFO, not a regular file" in predicted.stderr


@pytest.mark.parametrize("target, said", [(".", "is a link to .*train or a folder above it"),
                                          ("..", "is a link to .*train or a folder above it"),
                                          ("blue", "'blue' and 'red' of .*train are one folder")])
def test_a_class_folder_that_links_to_its_split_or_another_class_is_refused_in_one_line(tmp_path, target, said):
    write_image_folder(tmp_path, {"train": 2, "val": 1}, classes=("blue",))
    (tmp_path / "train" / "red").symlink_to(target)
    (tmp_path / "val" / "red").mkdir()
    with pytest.raises(DataError, match=said):
        load_image_folders(tmp_path)


def test_a_plain_folder_lists_in_torchvisions_order(tmp_path):
    """The same samples in the same order as torchvision's ImageFolder, so runs started before keep their batches."""
    from torchvision.datasets.folder import IMG_EXTENSIONS, make_dataset

    for name in ("b.png", "a.png", "A.PNG", "sub/x.png", "sub/deep/y.jpg", "sub2/a.png", "Z/q.png", "sub-a.png",
                 "sub.png", "notes.txt"):
        if name.endswith(".txt"):
            (tmp_path / "c" / name).write_text("not an image")
        else:
            write_image(tmp_path / "c" / name, "RGB", (4, 4))
    files, skipped = list_images(tmp_path / "c")
    assert files == [p for p, _ in make_dataset(str(tmp_path), {"c": 0}, extensions=IMG_EXTENSIONS)] and not skipped
    assert len(files) == 9
