"""Loader workers start inside a parallel sweep job (hydra/launcher=parallel runs jobs in joblib's loky
worker processes, whose default start method is loky's own: DataLoader workers failed there with
"'Process' object has no attribute 'env'", so every image-folder job of such a sweep failed)."""

import multiprocessing

import pytest

from vit_train.data.loaders import worker_context


@pytest.mark.parametrize("current, expected", [(None, None), ("fork", None), ("spawn", None), ("forkserver", None),
                                               ("loky", "fork")])
def test_loader_workers_use_a_standard_start_method(monkeypatch, current, expected):
    monkeypatch.setattr(multiprocessing, "get_start_method", lambda allow_none=False: current)
    assert worker_context() == expected


def first_batch_in_a_loky_worker(root: str) -> tuple[str, list[int]]:
    import torch

    from helpers.configs import tiny_config
    from helpers.configs import build_data

    cfg = tiny_config(data={"name": "imagefolder", "root": root, "batch_size": 4, "num_workers": 1})
    data = build_data(cfg, torch.device("cpu"), 0, 1)
    images, labels = next(iter(data.train_loader))
    return multiprocessing.get_start_method(), list(images.shape)


def test_an_image_folder_loads_with_workers_inside_a_parallel_sweep_worker(tmp_path):
    joblib = pytest.importorskip("joblib")
    from helpers.images import write_image_folder

    root = write_image_folder(tmp_path / "data", {"train": 4, "val": 2}, size=(16, 16))
    method, shape = joblib.Parallel(n_jobs=2, backend="loky")(  # n_jobs=1 would run in this process
        joblib.delayed(first_batch_in_a_loky_worker)(str(root)) for _ in range(2))[0]
    assert method == "loky" and shape == [4, 3, 16, 16]
