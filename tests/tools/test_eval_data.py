"""vit-eval data=NAME: the section of the option named replaces the checkpoint's, but how the images are read
(data.batch_size, data.num_workers, ...) stays the checkpoint's unless given: naming the run's own data set
again took the option's default batch of 256 and refused a 48-image set as "larger than the training set"."""

from __future__ import annotations

from helpers.configs import tiny_config
from vit_train.cli.commands import _eval
from vit_train.train.trainer import train


def test_naming_the_data_again_keeps_the_checkpoints_batch_size(tmp_path, image_folder):
    run = tmp_path / "run"
    train(tiny_config(data={"name": "imagefolder", "root": str(image_folder), "batch_size": 8},
                      trainer={"max_steps": 1}), run)
    for extra in ([], ["data.batch_size=4"]):
        results, _ = _eval([f"ckpt={run}", "data=imagefolder", f"data.root={image_folder}", "attention.images=0",
                            f"out={tmp_path / 'eval'}{len(extra)}", "progress=false", *extra])
        assert results["images"] == 12  # the val images, evaluated with the checkpoint's (or the given) batch
