"""vit-predict's `images=`: files, folders (their own image files, sorted) and glob patterns (`**` for
a tree); a pattern that matches nothing or a folder without images is one line and exit status 2.
And transparency: dropped as torchvision and timm drop it, and said in one line naming the file."""

import json
import logging

import numpy as np
import pytest
from PIL import Image

from helpers.configs import tiny_config
from helpers.in_process import run_main
from vit_train.cli import commands
from vit_train.data.decoding import image as decode
from vit_train.errors import DataError
from vit_train.tools.predict import image_files
from vit_train.train.trainer import train


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    train(tiny_config(trainer={"max_steps": 1}), run_dir)
    return run_dir / "checkpoints" / "last.pt"


@pytest.fixture
def photos(tmp_path):
    """photos/{b.png, a.JPG, notes.txt, .hidden.png, sub/c.png, sub/deeper/d.png}; returns the folder."""
    root = tmp_path / "photos [1]"  # a bracket in a real name: an existing path is never a pattern
    for name in ("b.png", "a.JPG", ".hidden.png", "sub/c.png", "sub/deeper/d.png"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (20, 20), (200, 30, 30)).save(root / name, format="PNG" if name.endswith("png") else "JPEG")
    (root / "notes.txt").write_text("not an image")
    return root


def test_a_folder_gives_its_own_image_files_sorted_and_a_pattern_its_matches(photos):
    folder = str(photos)
    assert image_files([folder]) == [f"{folder}/a.JPG", f"{folder}/b.png"]  # no notes.txt, .hidden.png, sub/
    # glob.escape: the folder's own '[1]' is not a pattern
    tree = f"{folder.replace('[', '[[]')}/**/*.png"
    assert image_files([tree]) == [f"{folder}/b.png", f"{folder}/sub/c.png", f"{folder}/sub/deeper/d.png"]
    assert image_files([f"{folder.replace('[', '[[]')}/*"]) == [f"{folder}/a.JPG", f"{folder}/b.png"]
    assert image_files([f"{folder}/sub/c.png", folder]) == [f"{folder}/sub/c.png", f"{folder}/a.JPG", f"{folder}/b.png"]


def test_a_pattern_matching_no_image_or_a_folder_without_images_is_one_line(photos, tmp_path):
    with pytest.raises(DataError, match=r"^images: the pattern '.*\*\.gif' matches no image file \(image types: "):
        image_files([str(tmp_path / "*.gif")])
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "inner").mkdir()
    with pytest.raises(DataError, match=r"^images: the folder .*empty holds no image files .* sub-folders are not read"):
        image_files([str(tmp_path / "empty")])


def test_vit_predict_on_a_folder_and_a_pattern_through_the_command(checkpoint, photos, monkeypatch, capsys):
    folder = str(photos)
    status, out, err = run_main(commands.predict_main, monkeypatch, capsys, f"ckpt={checkpoint}",
                                f"""'images=["{folder}","{folder.replace('[', '[[]')}/sub/*.png"]'""".strip("'"),
                                "--json")
    assert status == 0, err
    assert [r["file"] for r in json.loads(out)] == [f"{folder}/a.JPG", f"{folder}/b.png", f"{folder}/sub/c.png"]
    status, out, err = run_main(commands.predict_main, monkeypatch, capsys, f"ckpt={checkpoint}",
                                f"""images=["{photos.parent}/nothing/*.png"]""")
    assert status == 2 and out == ""
    assert err.strip().count("\n") == 0 and "matches no image file" in err and "Traceback" not in err


def _transparent_square(hidden_rgb: tuple[int, int, int]) -> Image.Image:
    """A red square on a fully transparent 20x20 background whose stored colour is `hidden_rgb`."""
    image = Image.new("RGBA", (20, 20), (*hidden_rgb, 0))
    image.paste((220, 20, 20, 255), (5, 5, 15, 15))
    return image


def test_transparency_is_dropped_and_said_once_with_the_colour_under_it(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(decode, "_said_transparency", False)
    _transparent_square((255, 255, 255)).save(tmp_path / "white_under.png")
    _transparent_square((0, 0, 0)).save(tmp_path / "black_under.png")
    with caplog.at_level(logging.INFO, logger="vit_train"):
        white = np.asarray(decode.open_rgb(tmp_path / "white_under.png"))
        black = np.asarray(decode.open_rgb(tmp_path / "black_under.png"))
    # the alpha channel is dropped (torchvision's and timm's convert("RGB")): the stored colours show
    assert white[0, 0].tolist() == [255, 255, 255] and black[0, 0].tolist() == [0, 0, 0]
    assert white[10, 10].tolist() == black[10, 10].tolist() == [220, 20, 20]
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("transparency: ")]
    assert len(said) == 1  # once per process, not per image
    assert f"{tmp_path / 'white_under.png'} (mode RGBA) is read without its alpha channel" in said[0]
    assert "(75% of it is fully transparent and holds RGB (255, 255, 255) on average)" in said[0]
    assert "docs/data.md" in said[0]


@pytest.mark.parametrize("mode", ["LA", "P"])
def test_other_transparent_modes_are_said_too_and_opaque_ones_are_not(tmp_path, monkeypatch, caplog, mode):
    monkeypatch.setattr(decode, "_said_transparency", False)
    Image.new("RGB", (8, 8), (10, 20, 30)).save(tmp_path / "opaque.png")
    image = _transparent_square((0, 0, 0))
    image = image.convert("LA") if mode == "LA" else image.convert("P")
    if mode == "P":
        image.info["transparency"] = image.getpixel((0, 0))
        image.save(tmp_path / "t.png", transparency=image.getpixel((0, 0)))
    else:
        image.save(tmp_path / "t.png")
    with caplog.at_level(logging.INFO, logger="vit_train"):
        decode.open_rgb(tmp_path / "opaque.png")
        assert not [r for r in caplog.records if r.getMessage().startswith("transparency: ")]
        decode.open_rgb(tmp_path / "t.png")
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("transparency: ")]
    assert f"{tmp_path / 't.png'} (mode {'LA' if mode == 'LA' else 'P'})" in line
    assert "75% of it is fully transparent" in line


def test_vit_predict_says_the_transparency_on_stderr(checkpoint, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(decode, "_said_transparency", False)
    _transparent_square((255, 255, 255)).save(tmp_path / "cut-out.png")
    status, out, err = run_main(commands.predict_main, monkeypatch, capsys, f"ckpt={checkpoint}",
                                f"images=[{tmp_path / 'cut-out.png'}]")
    assert status == 0, err
    assert out.startswith(f"{tmp_path / 'cut-out.png'}: ")
    assert [line for line in err.splitlines() if line.startswith("transparency: ")] != []
