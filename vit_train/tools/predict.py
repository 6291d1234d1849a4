"""vit-predict: the top-k classes of image files, with the checkpoint's preprocessing and class names."""

from __future__ import annotations

from pathlib import Path

import torch
from PIL import Image

from vit_train.config.schema import Config
from vit_train.data.decode import IMAGE_ERRORS, open_rgb
from vit_train.data.preprocess import eval_spec, eval_transform
from vit_train.errors import ConfigError, DataError
from vit_train.models.mae import MaskedAutoencoder
from vit_train.models.vit import VisionTransformer


def read_image(path: str | Path) -> Image.Image:
    """`path` as an RGB image, decoded as the training loader decodes it (data/decode.py)."""
    try:
        return open_rgb(path)
    except FileNotFoundError:
        raise DataError(f"image {path} does not exist") from None
    except IMAGE_ERRORS as e:
        raise DataError(f"{path} cannot be read as an image ({type(e).__name__}: {str(e)[:200]})") from None


@torch.no_grad()
def predict(model: VisionTransformer, ckpt: dict, cfg: Config, files: list[str], top_k: int = 5) -> list[dict]:
    """For each file, the `top_k` classes with their probabilities, most likely first."""
    refuse_pretraining(model, "predicts no classes")
    if not files:
        raise ConfigError("no images given: images=[a.jpg,b.png]")
    transform = eval_transform(ckpt.get("preprocess") or eval_spec(cfg))
    batch = torch.stack([transform(read_image(f)) for f in files])
    probs = model(batch).float().softmax(dim=1)
    top = probs.topk(min(top_k, probs.shape[1]), dim=1)
    names = ckpt["class_names"]
    return [{"file": str(f), "top": [{"class": names[i], "probability": p}
                                     for p, i in zip(values.tolist(), indices.tolist())]}
            for f, values, indices in zip(files, top.values, top.indices)]


def refuse_pretraining(model: torch.nn.Module, what: str) -> None:
    """A masked-autoencoder checkpoint (objective mae) has no classifier: one line on what to do instead."""
    if isinstance(model, MaskedAutoencoder):
        raise ConfigError(f"this is a masked-autoencoder pre-training checkpoint (objective=mae); it {what}. "
                          f"Fine-tune it first: vit-train model.pretrained=<its run directory> (docs/mae.md)")
