"""What `datasets` stores of image cells that hold file paths, as docs/data.md (data=hf, "Images") says it:
`save_to_disk` of an `Image` column embeds the files' bytes and keeps their base names, `to_parquet` keeps the
paths only, a string column stays strings. Read from the files `datasets` writes (the Arrow stream, the parquet
file), not through `datasets` itself; and data=hf reads the saved set once the image files are gone."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

datasets = pytest.importorskip("datasets")

from vit_train.data.sources.hf import load_hf_splits  # noqa: E402

DOC = Path(__file__).resolve().parents[2] / "docs" / "data.md"


def _pictures(folder: Path, n: int = 4) -> list[Path]:
    folder.mkdir(parents=True)
    paths = []
    for i in range(n):
        path = folder / f"{i}.png"
        Image.fromarray(np.full((6, 6, 3), 40 * i, np.uint8)).save(path)
        paths.append(path)
    return paths


def _arrow_column(folder: Path, column: str) -> list:
    cells = []
    for file in sorted(folder.rglob("*.arrow")):
        with pa.memory_map(str(file)) as source:
            cells += pa.ipc.open_stream(source).read_all().column(column).to_pylist()
    return cells


def _doc_paragraph() -> str:
    text = " ".join(DOC.read_text().split())
    return text[text.index("What a save keeps of such cells"):text.index("When every image is missing")]


def test_save_to_disk_embeds_an_image_columns_files_and_to_parquet_keeps_the_paths(tmp_path):
    paths = _pictures(tmp_path / "files")
    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    ds = datasets.Dataset.from_dict({"image": [str(p) for p in paths], "label": [0, 1, 0, 1]}, features=features)
    ds.save_to_disk(str(tmp_path / "saved"))
    saved = _arrow_column(tmp_path / "saved", "image")
    assert [c["bytes"] for c in saved] == [p.read_bytes() for p in paths]  # the files' bytes, unchanged
    assert [c["path"] for c in saved] == [p.name for p in paths]  # base names only
    ds.to_parquet(str(tmp_path / "train.parquet"))
    cells = pq.read_table(tmp_path / "train.parquet").column("image").to_pylist()
    assert [c["bytes"] for c in cells] == [None] * 4 and [c["path"] for c in cells] == [str(p) for p in paths]
    strings = datasets.Dataset.from_dict({"image": [str(p) for p in paths]})
    strings.save_to_disk(str(tmp_path / "strings"))
    assert _arrow_column(tmp_path / "strings", "image") == [str(p) for p in paths]
    said = _doc_paragraph()
    assert re.search(r"\(measured with `datasets` \d+\.\d+\.\d+\)", said), said  # and names the version
    for claim in ("`save_to_disk` of an `Image` column whose cells hold paths embeds each file's bytes",
                  "keeps only the file's base name", "`to_parquet` of that column stores only the paths",
                  "either call stores a string column of paths as strings"):
        assert claim in said, claim


def test_data_hf_reads_a_save_to_disk_set_of_path_cells_once_the_files_are_gone(tmp_path):
    paths = _pictures(tmp_path / "files")
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b"])})
    ds = datasets.Dataset.from_dict({"image": [str(p) for p in paths], "label": [0, 1, 0, 1]}, features=features)
    datasets.DatasetDict({"train": ds, "validation": ds}).save_to_disk(str(tmp_path / "saved"))
    for path in paths:
        path.unlink()
    train, _, names = load_hf_splits(tmp_path / "saved", "image", "label", "train", None)
    assert names == ["a", "b"]
    assert [int(np.asarray(train[i][0])[0, 0, 0]) for i in range(4)] == [0, 40, 80, 120]

