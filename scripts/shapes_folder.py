"""Write the built-in shapes images as an image folder: DIR/train/<class>/*.png and DIR/val/<class>/*.png, for
trying data=imagefolder (and scripts/mae_demo.py --folder) on images vit-train does not ship (docs/mae.md, "The
recipe on an image folder"). The train and val images are two draws of the generator (seeds 100 and 101: neither
is data=shapes' own draw); the classes balanced; PNG, so the pixels are exactly the generator's.

    python scripts/shapes_folder.py shapes_folder                      # 10,000 train, 2,000 val at 32x32
    python scripts/shapes_folder.py small --train 500 --val 100 --size 64
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's vit_train


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", help="the folder to write (must not exist, or be empty)")
    parser.add_argument("--train", type=int, default=10000, help="train images; 10000")
    parser.add_argument("--val", type=int, default=2000, help="val images; 2000")
    parser.add_argument("--size", type=int, default=32, help="image side in pixels; 32")
    args = parser.parse_args()
    root = Path(args.dir)
    for key in ("train", "val", "size"):
        if getattr(args, key) < 1:
            parser.error(f"--{key} must be at least 1, got {getattr(args, key)}")
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        parser.error(f"{root} exists and is not an empty folder: give another DIR, or remove it")

    from PIL import Image

    from vit_train.data.sources.shapes import CLASS_NAMES, generate_shapes

    for split, count, seed in (("train", args.train, 100), ("val", args.val, 101)):
        images, labels = generate_shapes(count, args.size, seed)
        for index, (image, label) in enumerate(zip(images, labels, strict=True)):
            folder = root / split / CLASS_NAMES[int(label)]
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image.permute(1, 2, 0).numpy()).save(folder / f"{index:05d}.png")
    print(f"wrote {args.train} train and {args.val} val images of {len(CLASS_NAMES)} classes at {args.size}x{args.size} "
          f"under {root}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
