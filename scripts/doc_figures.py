"""Make the example figures of docs/looking-inside.md (docs/figures/) from a trained shapes checkpoint.

    vit-train experiment=quickstart hydra.run.dir=outputs/quickstart
    python scripts/doc_figures.py outputs/quickstart/checkpoints/best.pt docs/figures

Writes what `vit-eval ... attention.images=4` writes (attention, rollout, heads, confusion matrix,
position similarity, patch filters) and a batch of training images after `aug=deit` augmentation.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from vit_train.config import Config
from vit_train.data.mix import BatchMix
from vit_train.tools.report import evaluate_checkpoint
from vit_train.viz.figures import denormalize, images_figure, save_figure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    results = evaluate_checkpoint(args.checkpoint, attention_images=4, out_dir=args.out, progress=False)
    (args.out / "metrics.json").unlink()

    deit = {"name": "deit", "mixup_alpha": 0.8, "cutmix_alpha": 1.0, "random_erasing": 0.25, "label_smoothing": 0.1}
    cfg = Config.from_dict({"aug": deit, "data": {"batch_size": 16, "train_size": 64, "val_size": 16}})
    data = cfg.data.build(cfg, torch.device("cpu"))
    images, labels = next(iter(data.train_loader))
    images, targets = BatchMix(cfg.aug, len(data.class_names), cfg.seed)(images, labels, step=0)
    share, index = targets.max(dim=1)
    titles = [f"{data.class_names[i]} {s:.2f}" for s, i in zip(share.tolist(), index.tolist())]
    save_figure(images_figure(denormalize(images, data.stats), titles), args.out / "training_images.png")
    print(f"top-1 {results['top1']:.2f}%; figures in {args.out}")


if __name__ == "__main__":
    main()
