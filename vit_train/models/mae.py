"""Masked autoencoder pre-training (He et al. 2022, "Masked Autoencoders Are Scalable Vision Learners").

Each image loses a random `mask_ratio` of its patches; the encoder, our own VisionTransformer,
runs on the visible patches only (the speed win); a light decoder with fixed 2-D sin-cos positions
gets the encoded visible tokens plus a shared mask token at every masked position and predicts the
pixels of every patch; the loss is the mean squared error on the masked patches only, against
pixels normalised per patch (`norm_pix_loss`). Written after facebookresearch/mae's models_mae.py.

State-dict keys: `encoder.*` are the VisionTransformer's own (timm's names, no head), so
`model.pretrained` reads an MAE run's encoder by stripping the prefix; `decoder.*` is dropped then.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from vit_train.models.vit import Block, VisionTransformer, set_grad_checkpointing, sincos_2d
from vit_train.schema.sections import ModelConfig

NORM_PIX_EPS = 1e-6  # added to the patch variance before the square root, as in facebookresearch/mae
EVAL_SEED = 12345  # seeds the val masks: the same at every evaluation and figure, so they compare across steps


def patchify(images: torch.Tensor, patch_size: int) -> torch.Tensor:
    """(B, C, H, W) -> (B, N, p*p*C): patches in row-major order, each flattened as (row, column, channel)."""
    B, C, H, W = images.shape
    h, w = H // patch_size, W // patch_size
    x = images.reshape(B, C, h, patch_size, w, patch_size)
    return x.permute(0, 2, 4, 3, 5, 1).reshape(B, h * w, patch_size * patch_size * C)


def unpatchify(patches: torch.Tensor, patch_size: int, channels: int = 3) -> torch.Tensor:
    """(B, N, p*p*C) -> (B, C, H, W), the inverse of `patchify` for a square grid."""
    B, N, _ = patches.shape
    side = round(N**0.5)
    x = patches.reshape(B, side, side, patch_size, patch_size, channels)
    return x.permute(0, 5, 1, 3, 2, 4).reshape(B, channels, side * patch_size, side * patch_size)


def num_visible(num_patches: int, mask_ratio: float) -> int:
    """Patches each image keeps: int(N * (1 - mask_ratio)), as in facebookresearch/mae."""
    return int(num_patches * (1 - mask_ratio))


class MaskSampler:
    """Per-image random masking noise from a counter-based seed.

    Draw k uses a generator seeded with (seed, rank, k), so the whole state is one integer, the same
    on every process: a run resumed from `state_dict()` draws exactly the masks it would have drawn,
    and each process (rank) masks its own images differently.
    """

    def __init__(self, seed: int, rank: int = 0):
        self.seed, self.rank, self.draws = seed, rank, 0
        self._generators: dict[torch.device, torch.Generator] = {}

    def noise(self, batch: int, num_patches: int, device: torch.device) -> torch.Tensor:
        """(batch, num_patches) uniform noise in [0, 1); the smallest `num_visible` per row stay visible."""
        device = torch.device(device)
        generator = self._generators.get(device)
        if generator is None:
            generator = self._generators[device] = torch.Generator(device)
        generator.manual_seed(((self.seed * 1_000_003 + self.rank) * 1_000_033 + self.draws) % 2**63)
        self.draws += 1
        return torch.rand(batch, num_patches, generator=generator, device=device)

    def state_dict(self) -> dict[str, int]:
        return {"draws": self.draws}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.draws = int(state["draws"])


class MaeDecoder(nn.Module):
    """The light decoder: project to `dim`, fill masked positions with the mask token, add fixed
    sin-cos positions, `depth` transformer blocks, norm, and a linear map to each patch's pixels."""

    def __init__(self, encoder: VisionTransformer, dim: int, depth: int, num_heads: int, mlp_ratio: float = 4.0):
        super().__init__()
        embed_dim = encoder.patch_embed.proj.out_channels
        patch_size = encoder.patch_embed.proj.kernel_size[0]
        in_chans = encoder.patch_embed.proj.in_channels
        self.num_prefix_tokens = encoder.num_prefix_tokens
        self.decoder_embed = nn.Linear(embed_dim, dim)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, dim))
        prefix = torch.zeros(self.num_prefix_tokens, dim)  # prefix tokens get no position, as in MAE
        self.register_buffer(
            "decoder_pos_embed", torch.cat([prefix, sincos_2d(encoder.patch_embed.grid_size, dim)])[None]
        )
        self.decoder_blocks = nn.Sequential(
            *[Block(dim, num_heads, mlp_ratio, True, 0.0, 0.0, 0.0) for _ in range(depth)]
        )
        self.decoder_norm = nn.LayerNorm(dim, eps=1e-6)
        self.decoder_pred = nn.Linear(dim, patch_size * patch_size * in_chans)
        self.init_weights()

    def init_weights(self) -> None:
        """facebookresearch/mae's init: xavier-uniform linear weights, zero biases, mask token N(0, 0.02)."""
        nn.init.normal_(self.mask_token, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, latent: torch.Tensor, ids_restore: torch.Tensor) -> torch.Tensor:
        """latent (B, P + V, D) in shuffled order, ids_restore (B, N) -> predicted pixels (B, N, p*p*C)."""
        x = self.decoder_embed(latent)  # (B, P + V, d)
        P = self.num_prefix_tokens
        B, N = ids_restore.shape
        masked = self.mask_token.expand(B, N - (x.shape[1] - P), -1)
        patches = torch.cat([x[:, P:], masked], dim=1)  # (B, N, d): visible first, then masked
        patches = torch.gather(patches, 1, ids_restore[..., None].expand(-1, -1, x.shape[2]))  # back to image order
        x = torch.cat([x[:, :P], patches], dim=1) + self.decoder_pos_embed
        x = self.decoder_norm(self.decoder_blocks(x))
        return self.decoder_pred(x[:, P:])


class MaskedAutoencoder(nn.Module):
    """Encoder (a VisionTransformer, head unused) + MaeDecoder; forward(images, noise) -> (pred, mask)."""

    def __init__(
        self,
        encoder: VisionTransformer,
        mask_ratio: float = 0.75,
        decoder_dim: int = 128,
        decoder_depth: int = 2,
        decoder_heads: int = 4,
        norm_pix_loss: bool = True,
    ):
        super().__init__()
        self.norm_pix_loss = norm_pix_loss  # what the decoder learns to predict; figures map it back
        self.encoder = encoder
        self.decoder = MaeDecoder(encoder, decoder_dim, decoder_depth, decoder_heads)
        self.mask_ratio = mask_ratio
        self.patch_size = encoder.patch_embed.proj.kernel_size[0]
        self.num_patches = encoder.patch_embed.num_patches

    def forward_encoder(self, images: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Encode the visible patches only: (latent (B, P + V, D), ids_restore (B, N), mask (B, N), 1 = masked).

        The visible patches are picked from the pixels, so a masked patch reaches no encoder module,
        not even the patch projection (applied as the matrix product it is); the P prefix tokens and
        the position embeddings are the model's own, as in its embed().
        """
        enc = self.encoder
        P = enc.num_prefix_tokens
        B, N = noise.shape
        keep = num_visible(N, self.mask_ratio)
        ids_shuffle = noise.argsort(dim=1)  # ascending: the smallest noise stays visible
        ids_restore = ids_shuffle.argsort(dim=1)
        ids_keep = ids_shuffle[:, :keep]  # (B, V)
        pixels = patchify(images, self.patch_size)  # (B, N, p*p*C), (row, column, channel) order
        pixels = torch.gather(pixels, 1, ids_keep[..., None].expand(-1, -1, pixels.shape[2]))  # (B, V, p*p*C)
        proj = enc.patch_embed.proj
        weight = proj.weight.permute(0, 2, 3, 1).flatten(1)  # (D, C, p, p) -> (D, p*p*C), patchify's order
        x = F.linear(pixels, weight, proj.bias)  # (B, V, D)
        pos = enc.pos_embed.expand(B, -1, -1)
        x = x + torch.gather(pos[:, P:], 1, ids_keep[..., None].expand(-1, -1, x.shape[2]))
        if P:
            x = torch.cat([(enc.prefix_tokens() + enc.pos_embed[:, :P]).expand(B, -1, -1), x], dim=1)  # (B, P + V, D)
        latent = enc.norm(enc.blocks(enc.pos_drop(x)))
        mask = torch.ones(B, N, device=images.device)
        mask[:, :keep] = 0
        return latent, ids_restore, torch.gather(mask, 1, ids_restore)

    def forward(self, images: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """images (B, C, H, W), noise (B, N) from MaskSampler -> (pred (B, N, p*p*C), mask (B, N))."""
        latent, ids_restore, mask = self.forward_encoder(images, noise)
        return self.decoder(latent, ids_restore), mask


def reconstruction_loss(
    pred: torch.Tensor, images: torch.Tensor, mask: torch.Tensor, patch_size: int, norm_pix_loss: bool
) -> torch.Tensor:
    """Mean squared error over the masked patches (mask 1), in float32.

    With `norm_pix_loss` each target patch is normalised by its own mean and (unbiased) variance
    plus 1e-6, as in facebookresearch/mae (the paper's "normalized pixels" variant).
    """
    target = patch_targets(images, patch_size, norm_pix_loss)
    per_patch = (pred.float() - target).pow(2).mean(dim=-1)  # (B, N)
    return (per_patch * mask).sum() / mask.sum()


def patch_targets(images: torch.Tensor, patch_size: int, norm_pix_loss: bool) -> torch.Tensor:
    """(B, N, p*p*C) float32 targets: the pixels of each patch, normalised per patch with `norm_pix_loss`."""
    target = patchify(images.float(), patch_size)
    if norm_pix_loss:
        mean, var = target.mean(dim=-1, keepdim=True), target.var(dim=-1, keepdim=True)
        target = (target - mean) / (var + NORM_PIX_EPS).sqrt()
    return target


@torch.no_grad()
def reconstruct(
    model: MaskedAutoencoder, images: torch.Tensor, noise: torch.Tensor, norm_pix_loss: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(masked, reconstruction) images (B, C, H, W) in the input's normalisation, for figures.

    Masked patches are zero in `masked`; `reconstruction` shows the visible patches as they are and
    the predicted ones elsewhere (with norm_pix_loss, mapped back with the true patch's mean and std).
    """
    pred, mask = model(images, noise)
    pred = pred.float()
    p = model.patch_size
    target = patchify(images.float(), p)
    if norm_pix_loss:
        mean, var = target.mean(dim=-1, keepdim=True), target.var(dim=-1, keepdim=True)
        pred = pred * (var + NORM_PIX_EPS).sqrt() + mean
    m = mask[..., None]
    masked = unpatchify(target * (1 - m), p, images.shape[1])
    return masked, unpatchify(target * (1 - m) + pred * m, p, images.shape[1])


def build_autoencoder(model_cfg: ModelConfig, mae) -> MaskedAutoencoder:
    """The encoder from `model_cfg` (no head: pre-training has no classes) and the decoder from `mae` (objective=mae's
    keys: mask_ratio, decoder_dim, decoder_depth, decoder_heads, norm_pix_loss)."""
    model = MaskedAutoencoder(
        model_cfg.build(0), mae.mask_ratio, mae.decoder_dim, mae.decoder_depth, mae.decoder_heads, mae.norm_pix_loss
    )
    set_grad_checkpointing(model, model_cfg.grad_checkpointing)  # the decoder's blocks too
    return model


def mae_flops_per_image(model_cfg: ModelConfig, mae) -> float:
    """Training FLOPs (forward and backward) of one image in MAE pre-training, counted on the meta device."""
    with torch.device("meta"):
        model = build_autoencoder(model_cfg, mae)
        set_grad_checkpointing(model, False)  # model FLOPs: grad checkpointing's recomputation is not counted
        images = torch.empty(1, 3, model_cfg.img_size, model_cfg.img_size)
        noise = torch.empty(1, model.num_patches)
    with FlopCounterMode(display=False) as counter:
        pred, _ = model(images, noise)
        pred.sum().backward()
    return float(counter.get_total_flops())
