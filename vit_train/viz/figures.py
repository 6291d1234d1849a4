"""Figures of a ViT's insides (vit-eval's, and TensorBoard's during training): attention per layer
and head, attention rollout (computed in attention.py), positions, patch filters, confusion.

The figures use matplotlib's object-oriented API (no pyplot,
no display), so they render headless; matplotlib is the optional extra `[viz]`.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vit_train.extras import require
from vit_train.models.mae import EVAL_SEED, MaskedAutoencoder, MaskSampler, reconstruct
from vit_train.models.vit import VisionTransformer
from vit_train.viz.attention import attention_rollout, pooled_attention, position_similarity
from vit_train.viz.fonts import fonts_for, quiet_missing_glyphs

CELL = 1.6  # inches per image tile
DPI = 100  # so a tile is 160 x 160 pixels
MARGIN = 0.08  # inches above the figure's title and between it and the tiles' titles
TITLE_PT, TILE_TITLE_PT = 9, 8  # font sizes; a line takes 1.25 times its size, a tile's title 6 pt more (its pad)


def denormalize(images: torch.Tensor, stats: tuple) -> torch.Tensor:
    """Normalised (B, 3, H, W) images back to [0, 1] for display."""
    mean = torch.tensor(stats[0], device=images.device)[:, None, None]
    std = torch.tensor(stats[1], device=images.device)[:, None, None]
    return (images.float() * std + mean).clamp(0, 1)


def upsample(maps: torch.Tensor, grid: int, size: int) -> torch.Tensor:
    """(..., grid*grid) patch values -> (..., size, size), bilinear, for overlays."""
    lead = maps.shape[:-1]
    square = maps.reshape(-1, 1, grid, grid).float()
    return F.interpolate(square, size=(size, size), mode="bilinear", align_corners=False).reshape(*lead, size, size)


# --- figures --------------------------------------------------------------------------------------


def _new_figure(rows: int, cols: int, title: str = "", tile_lines: int = 1):
    """A figure of rows x cols image tiles (CELL inches each, axes off) with room, in inches (so it
    holds for any number of rows), for `title` above the tiles (wrapped to the figure's width) and
    for tiles' titles of up to `tile_lines` lines above each row: no title prints over another."""
    require("matplotlib", "figures")
    from matplotlib.figure import Figure

    width, height = cols * CELL, rows * CELL
    lines = textwrap.wrap(title, max(20, int(width * 72 / (0.55 * TITLE_PT)))) if title else []
    tile_titles = (tile_lines * TILE_TITLE_PT * 1.25 + 6) / 72 if tile_lines else 0
    header = MARGIN + (len(lines) * TITLE_PT * 1.25 / 72 + MARGIN if lines else 0) + tile_titles
    gap, bottom = tile_titles + 0.05, 0.01 * height  # between rows: room for the next row's titles
    tile = max((height - header - bottom - (rows - 1) * gap) / rows, 0.1 * CELL)
    fig = Figure(figsize=(width, height), dpi=DPI)
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax in axes.flat:
        ax.set_axis_off()
    fig.subplots_adjust(left=0.01, right=0.99, bottom=0.01, top=1 - header / height, wspace=0.05, hspace=gap / tile)
    if lines:
        fig.suptitle("\n".join(lines), fontsize=TITLE_PT, y=1 - MARGIN / height, va="top")
    return fig, axes


def _show(ax, image: torch.Tensor, title: str = "", heat: torch.Tensor | None = None) -> None:
    ax.imshow(image.permute(1, 2, 0).cpu().numpy())
    if heat is not None:
        ax.imshow(heat.cpu().numpy(), cmap="inferno", alpha=0.6)
    if title:
        ax.set_title(title, fontsize=TILE_TITLE_PT)


def attention_figure(
    images: torch.Tensor, rollout: torch.Tensor, layers: torch.Tensor, labels: list[str], mean_pool: bool
):
    """One row per image: the image, its rollout, then each layer's head-averaged pooled attention.

    images (B, 3, S, S) in [0, 1]; rollout (B, N); layers (B, L, N).
    """
    with fonts_for(labels):
        count, depth = len(images), layers.shape[1]
        grid, size = math.isqrt(rollout.shape[-1]), images.shape[-1]
        who = "mean over tokens (mean pooling)" if mean_pool else "class token"
        lines = max((label.count("\n") + 1 for label in labels[:1]), default=1)  # the first row's titles
        fig, axes = _new_figure(
            count,
            depth + 2,
            f"attention of the {who}: rollout over all layers, then each layer (mean over heads)",
            tile_lines=lines,
        )
        for i in range(count):
            _show(axes[i, 0], images[i], labels[i])
            _show(axes[i, 1], images[i], "rollout" if i == 0 else "", upsample(rollout[i], grid, size))
            for layer in range(depth):
                heat = upsample(layers[i, layer], grid, size)
                _show(axes[i, layer + 2], images[i], f"layer {layer + 1}" if i == 0 else "", heat)
        return fig


def heads_figure(image: torch.Tensor, attention: torch.Tensor, mean_pool: bool):
    """Layers x heads grid of one image's pooled attention; attention (L, H, N)."""
    depth, heads = attention.shape[:2]
    grid, size = math.isqrt(attention.shape[-1]), image.shape[-1]
    fig, axes = _new_figure(
        depth, heads, f"{'mean-token' if mean_pool else 'class-token'} attention per layer (rows) and head (columns)"
    )
    for layer in range(depth):
        for head in range(heads):
            _show(axes[layer, head], image, f"L{layer + 1} H{head + 1}", upsample(attention[layer, head], grid, size))
    return fig


def confusion_figure(confusion: torch.Tensor, class_names: list[str]):
    """Row-normalised confusion matrix (rows: true class, columns: predicted), counts written in."""
    with fonts_for(class_names):
        classes = len(class_names)
        side = max(4, min(16, 0.45 * classes + 2)) / CELL
        fig, axes = _new_figure(1, 1)
        fig.set_size_inches(side * CELL, side * CELL)
        ax = axes[0, 0]
        ax.set_axis_on()
        rates = confusion.float() / confusion.sum(dim=1, keepdim=True).clamp(min=1)
        ax.imshow(rates.numpy(), cmap="Blues", vmin=0, vmax=1)
        if classes <= 30:
            ax.set_xticks(range(classes), class_names, rotation=90, fontsize=7)
            ax.set_yticks(range(classes), class_names, fontsize=7)
            for t in range(classes):
                for p in range(classes):
                    if confusion[t, p]:
                        ax.text(
                            p,
                            t,
                            str(int(confusion[t, p])),
                            ha="center",
                            va="center",
                            fontsize=6,
                            color="white" if rates[t, p] > 0.5 else "black",
                        )
        ax.set_xlabel("predicted")
        ax.set_ylabel("true")
        fig.subplots_adjust(left=0.2, right=0.98, bottom=0.2, top=0.92)
        ax.set_title(f"confusion matrix: {int(confusion.trace())} of {int(confusion.sum())} correct", fontsize=9)
        return fig


def position_figure(similarity: torch.Tensor):
    """One tile per patch position: that position's cosine similarity to every other (the ViT paper's fig. 7)."""
    grid = math.isqrt(similarity.shape[0])
    fig, axes = _new_figure(1, 1)
    fig.set_size_inches(max(4, grid * 0.5), max(4, grid * 0.5))
    # (row, col of the position, row, col of the other) -> tiles, with a blank line between tiles
    padded = F.pad(similarity.reshape(grid, grid, grid, grid), (0, 1, 0, 1), value=float("nan"))
    tiles = padded.permute(0, 2, 1, 3).reshape(grid * (grid + 1), grid * (grid + 1))
    axes[0, 0].imshow(tiles.numpy(), cmap="viridis")
    axes[0, 0].set_title(
        f"position embedding cosine similarity, {similarity.min():.2f} (dark) to 1 (light)", fontsize=9
    )
    return fig


def filters_figure(weight: torch.Tensor, limit: int = 64):
    """The first `limit` patch-embedding filters (embed_dim, 3, p, p) as RGB tiles, each scaled to [0, 1]."""
    w = weight[:limit].float()
    low, high = w.amin(dim=(1, 2, 3), keepdim=True), w.amax(dim=(1, 2, 3), keepdim=True)
    w = (w - low) / (high - low).clamp(min=1e-8)
    side = math.ceil(math.sqrt(len(w)))
    fig, axes = _new_figure(side, side)
    fig.set_size_inches(side * 0.6, side * 0.6 + 0.3)
    fig.subplots_adjust(top=1 - 0.3 / (side * 0.6 + 0.3))
    fig.suptitle("patch embedding filters (first layer)", fontsize=TITLE_PT)
    for i, f in enumerate(w):
        _show(axes[i // side, i % side], f)
    return fig


def images_figure(images: torch.Tensor, titles: list[str], columns: int = 8):
    """A grid of [0, 1] images with titles (e.g. training images after augmentation)."""
    with fonts_for(titles):
        rows = math.ceil(len(images) / columns)
        lines = max((t.count("\n") + 1 for t in titles[:columns]), default=1)  # the first row's titles
        fig, axes = _new_figure(rows, min(columns, len(images)), tile_lines=lines)
        for i, image in enumerate(images):
            _show(axes[i // columns, i % columns], image, titles[i])
        return fig


def reconstruction_figure(
    original: torch.Tensor, masked: torch.Tensor, reconstruction: torch.Tensor, mask_ratio: float
):
    """MAE: one row per image: the original, what the encoder sees, the reconstruction; all (B, 3, S, S) in [0, 1]."""
    fig, axes = _new_figure(len(original), 3, f"masked autoencoder, {100 * mask_ratio:.0f}% of the patches masked")
    for i in range(len(original)):
        first = i == 0
        _show(axes[i, 0], original[i], "original" if first else "")
        _show(axes[i, 1], masked[i], "masked (encoder input)" if first else "")
        _show(axes[i, 2], reconstruction[i], "reconstruction" if first else "")
    return fig


@torch.no_grad()
def reconstruction_figures(model: MaskedAutoencoder, images: torch.Tensor, stats: tuple) -> dict:
    """{"reconstruction": figure}: original / masked / reconstruction of normalised `images`, with the
    fixed val masks (mae.EVAL_SEED), so figures of different steps compare."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    images = images.to(device)
    noise = MaskSampler(EVAL_SEED).noise(len(images), model.num_patches, device)
    masked, rebuilt = reconstruct(model, images, noise, model.norm_pix_loss)
    model.train(was_training)
    shown = [denormalize(x.cpu(), stats) for x in (images, masked, rebuilt)]
    return {"reconstruction": reconstruction_figure(*shown, model.mask_ratio)}


def save_figure(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with quiet_missing_glyphs():  # fonts_for has said it once
        fig.savefig(path, dpi=DPI)
    return path


# --- a model's figures: vit-eval's, and TensorBoard's during training (trainer.viz_every) ----------

STREAM_BATCHES = 4  # a stream's val batches read to choose from (it has no labels to look at before reading)


def across_classes(labels: list[int], count: int) -> list[int]:
    """Indices of `count` items (or all there are) taken round-robin by class: the first item of each class,
    then the second of each, ..., classes in ascending order; with more classes than `count`, classes spread
    evenly over them (0, C/count, 2C/count, ...). Deterministic: the same labels give the same indices."""
    by_class: dict[int, list[int]] = {}
    for index, label in enumerate(labels):
        by_class.setdefault(int(label), []).append(index)
    classes = sorted(by_class)
    if len(classes) > count:
        classes = [classes[k * len(classes) // count] for k in range(count)]
    picks: list[int] = []
    for turn in range(max((len(v) for v in by_class.values()), default=0)):
        picks += [by_class[c][turn] for c in classes if turn < len(by_class[c])]
        if len(picks) >= count:
            break
    return picks[:count]


def _labels(base) -> list[int] | None:
    """A random-access data set's labels, read without its images (None when it does not expose them)."""
    for name in ("targets", "labels"):  # torchvision's ImageFolder; TensorImages, a Hugging Face split
        found = getattr(base, name, None)
        if found is not None:
            return [int(label) for label in (found.tolist() if torch.is_tensor(found) else found)]
    samples = getattr(base, "samples", None)  # (path, label) pairs
    return [int(label) for _, label in samples] if samples is not None else None


def figure_images(loader, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`count` val images and labels for the figures, across classes (`across_classes` of the val set's labels):
    a val set sorted by class shows several classes, not `count` images of its first. The same ones every time.

    Only the chosen images are read: a DataLoader's data set by index (an unreadable one is replaced by the
    next, as the loader replaces it), the on-device pipeline's tensors. A stream (data=webdataset), which cannot
    be read by index, is read until it has shown `count` classes, for STREAM_BATCHES batches at most, keeping
    the first `count` images of each of the first `count` classes, and chosen among those."""
    dataset = getattr(loader, "dataset", None)
    base = getattr(dataset, "base", None)
    labels = _labels(base) if base is not None else None
    if labels is not None:
        items = [dataset[i] for i in across_classes(labels, count)]
        return torch.stack([item[0] for item in items]), torch.tensor([int(item[1]) for item in items])
    if torch.is_tensor(getattr(loader, "images", None)) and torch.is_tensor(getattr(loader, "labels", None)):
        picks = torch.tensor(across_classes(loader.labels.tolist(), count), device=loader.labels.device)
        return loader.transform(loader.images[picks]).as_subclass(torch.Tensor), loader.labels[picks]
    kept: dict[int, list[torch.Tensor]] = {}  # the first `count` classes met, up to `count` images each
    for read, (batch, targets) in enumerate(loader, 1):
        for image, label in zip(batch, targets.tolist(), strict=True):
            if (label in kept or len(kept) < count) and len(kept.setdefault(label, [])) < count:
                kept[label].append(image.clone())  # not a view: the batch is freed
        if len(kept) >= count or read >= STREAM_BATCHES:
            break
    labels = [label for label in kept for _ in kept[label]]
    images = [image for label in kept for image in kept[label]]
    picks = across_classes(labels, count)
    return torch.stack([images[i] for i in picks]), torch.tensor([labels[i] for i in picks])


first_images = figure_images  # the name vit-eval imports (tools/report.py)


@torch.no_grad()
def model_figures(
    model: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor,
    class_names: list[str],
    stats: tuple,
    confusion: torch.Tensor | None = None,
) -> dict[str, Any]:
    """Figures of `model` on normalised `images`: attention and rollout, per-head attention of the
    first image, position-embedding similarity, patch-embedding filters, and the confusion matrix.
    A model without attention (a ResNet) gets the confusion matrix only."""
    if not isinstance(model, VisionTransformer):
        return {"confusion": confusion_figure(confusion, class_names)} if confusion is not None else {}
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    logits, maps = model.attention_maps(images.to(device))
    model.train(was_training)
    maps = [m.float().cpu() for m in maps]
    prefix, mean_pool, readout = model.num_prefix_tokens, model.pool == "mean", model.readout_weights()
    attention = pooled_attention(maps, prefix, readout)  # (B, L, H, N)
    probs = logits.float().softmax(dim=1).cpu()
    titles = [
        f"{class_names[t]}\npred {class_names[p]} {probs[i, p]:.2f}"
        for i, (t, p) in enumerate(zip(labels.tolist(), probs.argmax(dim=1).tolist(), strict=True))
    ]
    shown = denormalize(images.cpu(), stats)
    figures = {
        "attention": attention_figure(
            shown, attention_rollout(maps, prefix, readout), attention.mean(dim=2), titles, mean_pool
        ),
        "attention_heads": heads_figure(shown[0], attention[0], mean_pool),
        "position_similarity": position_figure(position_similarity(model.pos_embed.detach().cpu(), prefix)),
        "patch_filters": filters_figure(model.patch_embed.proj.weight.detach().cpu()),
    }
    if confusion is not None:
        figures["confusion"] = confusion_figure(confusion, class_names)
    return figures


class TrainingVisuals:
    """Figures for TensorBoard during training: the model's figures on a fixed set of val images
    every `every` evaluations, and one batch of training images as the model sees them. `draw` makes
    the model's figures: draw(model, images, labels, confusion=...) -> {name: figure} (the run's
    objective's `figures`)."""

    def __init__(self, tb, every: int, data, draw: Callable[..., dict], count: int = 8):
        require("matplotlib", "trainer.viz_every", hint=", or set trainer.viz_every=null")
        self.tb, self.every, self.data, self.draw = tb, every, data, draw
        self.images, self.labels = figure_images(data.val_loader, count)
        self.evals = 0
        self.batch_shown = False

    def after_eval(self, model: torch.nn.Module, step: int, confusion: torch.Tensor | None) -> None:
        self.evals += 1
        if self.evals % self.every:
            return
        figures = self.draw(model, self.images, self.labels, confusion=confusion)
        with quiet_missing_glyphs():  # fonts_for has said it once
            for name, fig in figures.items():
                self.tb.add_figure(f"figures/{name}", fig, step)

    def training_batch(self, images: torch.Tensor, targets: torch.Tensor, step: int, count: int = 16) -> None:
        """The first batch after augmentation (and MixUp/CutMix): titles give the target's main class and share."""
        self.batch_shown = True
        names = self.data.class_names
        if targets.ndim == 1:
            titles = [names[t] for t in targets[:count].tolist()]
        else:
            share, index = targets[:count].max(dim=1)
            titles = [f"{names[i]} {s:.2f}" for s, i in zip(share.tolist(), index.tolist(), strict=True)]
        fig = images_figure(denormalize(images[:count].cpu(), self.data.stats), titles)
        with quiet_missing_glyphs():
            self.tb.add_figure("figures/training_images", fig, step)
