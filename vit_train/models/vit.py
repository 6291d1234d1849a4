"""The Vision Transformer (Dosovitskiy et al. 2021), with timm's parameter names.

Image -> patches (strided conv) -> tokens (+ prefix tokens) + position embeddings -> pre-norm blocks
(multi-head self-attention, GELU MLP, each with a residual) -> final norm -> pool -> linear head.
Names match timm's `VisionTransformer` (and `VisionTransformerDistilled`), so state dicts move between
the two without conversion. Options, each off by default and named as in timm:

- `reg_tokens`: register tokens `reg_token` (Darcet et al. 2024, "Vision Transformers Need Registers");
- `init_values`: LayerScale `ls1.gamma` / `ls2.gamma` (Touvron et al. 2021, CaiT);
- `qk_norm`: LayerNorm on each head's queries and keys, `attn.q_norm` / `attn.k_norm` (Dehghani et al. 2023);
- `distilled`: DeiT's distillation token `dist_token` and head `head_dist` (Touvron et al. 2021).

Prefix tokens come first, in timm's order: class token, distillation token, registers. Each prefix
token has a position embedding, as in timm without `no_embed_class` (for a learned table that is
the same function class as registers without positions: a constant added to a learned token).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from torchvision.ops import StochasticDepth


class PatchEmbed(nn.Module):
    """Cuts the image into non-overlapping patches and projects each to a token."""

    def __init__(self, img_size: int, patch_size: int, in_chans: int, embed_dim: int):
        super().__init__()
        self.grid_size = img_size // patch_size
        self.num_patches = self.grid_size**2
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)  # (B, D, gh, gw) -> (B, N, D)


class Attention(nn.Module):
    def __init__(
        self,
        dim: int,
        num_heads: int,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        qk_norm: bool = False,
    ):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.attn_drop = attn_drop
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.q_norm = nn.LayerNorm(self.head_dim, eps=1e-6) if qk_norm else nn.Identity()
        self.k_norm = nn.LayerNorm(self.head_dim, eps=1e-6) if qk_norm else nn.Identity()
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self._split_heads(x)
        drop = self.attn_drop if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=drop)  # (B, heads, N, head_dim)
        return self._merge_heads(out)

    def forward_first_queries(self, x: torch.Tensor, count: int) -> torch.Tensor:
        """The output at the first `count` tokens only (B, count, C): they query, every token is key and value."""
        q, k, v = self._split_heads(x)
        drop = self.attn_drop if self.training else 0.0
        return self._merge_heads(F.scaled_dot_product_attention(q[:, :, :count], k, v, dropout_p=drop))

    def forward_with_weights(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The explicit path: also returns the attention weights (B, heads, N, N), for maps."""
        q, k, v = self._split_heads(x)
        weights = (q @ k.transpose(-2, -1) * self.head_dim**-0.5).softmax(dim=-1)
        return self._merge_heads(weights @ v), weights

    def _split_heads(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # 3 x (B, heads, N, head_dim)
        return self.q_norm(q), self.k_norm(k), v

    def _merge_heads(self, x: torch.Tensor) -> torch.Tensor:
        B, _, N, _ = x.shape
        return self.proj_drop(self.proj(x.transpose(1, 2).reshape(B, N, -1)))  # (B, N, C)


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int, drop: float = 0.0):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden, dim)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))


class LayerScale(nn.Module):
    """Per-channel learned scale of a residual branch, `gamma` starting at `init_values` (CaiT; timm's LayerScale)."""

    def __init__(self, dim: int, init_values: float):
        super().__init__()
        self.init_values = init_values
        self.gamma = nn.Parameter(torch.full((dim,), init_values))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class Block(nn.Module):
    """Pre-norm transformer block: x + ls1(attn(norm(x))), then x + ls2(mlp(norm(x)))."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float,
        qkv_bias: bool,
        drop: float,
        attn_drop: float,
        drop_path: float,
        init_values: float | None = None,
        qk_norm: bool = False,
    ):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, num_heads, qkv_bias, attn_drop, drop, qk_norm)
        self.ls1 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path1 = StochasticDepth(drop_path, mode="row")
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop)
        self.ls2 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path2 = StochasticDepth(drop_path, mode="row")

        # model.grad_checkpointing: keep only the block's input; backward recomputes the rest (set_grad_checkpointing)
        self.grad_checkpointing = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.grad_checkpointing and torch.is_grad_enabled():
            return checkpoint(self._forward, x, use_reentrant=False)
        return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x))))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))

    def forward_first_tokens(self, x: torch.Tensor, count: int) -> torch.Tensor:
        """The block's output at the first `count` tokens only (B, count, D); the values forward() gives there."""
        if self.grad_checkpointing and torch.is_grad_enabled():
            return checkpoint(self._forward_first_tokens, x, count, use_reentrant=False)
        return self._forward_first_tokens(x, count)

    def _forward_first_tokens(self, x: torch.Tensor, count: int) -> torch.Tensor:
        first = x[:, :count] + self.drop_path1(self.ls1(self.attn.forward_first_queries(self.norm1(x), count)))
        return first + self.drop_path2(self.ls2(self.mlp(self.norm2(first))))

    def forward_with_weights(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out, weights = self.attn.forward_with_weights(self.norm1(x))
        x = x + self.ls1(out)
        return x + self.ls2(self.mlp(self.norm2(x))), weights


class VisionTransformer(nn.Module):
    def __init__(
        self,
        img_size: int = 224,
        patch_size: int = 16,
        in_chans: int = 3,
        num_classes: int = 1000,
        embed_dim: int = 768,
        depth: int = 12,
        num_heads: int = 12,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        pool: str = "cls",
        pos_embed: str = "learned",
        drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        reg_tokens: int = 0,
        init_values: float | None = None,
        qk_norm: bool = False,
        distilled: bool = False,
    ):
        super().__init__()
        self.pool = pool
        self.num_classes = num_classes
        self.patch_embed = PatchEmbed(img_size, patch_size, in_chans, embed_dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if pool == "cls" else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if distilled else None
        self.reg_token = nn.Parameter(torch.zeros(1, reg_tokens, embed_dim)) if reg_tokens else None
        self.num_reg_tokens = reg_tokens
        self.num_prefix_tokens = (pool == "cls") + distilled + reg_tokens
        num_tokens = self.patch_embed.num_patches + self.num_prefix_tokens
        if pos_embed == "learned":
            self.pos_embed = nn.Parameter(torch.zeros(1, num_tokens, embed_dim))
        else:  # fixed; a buffer keeps the state-dict key and shape that timm expects
            sincos = sincos_2d(self.patch_embed.grid_size, embed_dim)
            prefix = torch.zeros(self.num_prefix_tokens, embed_dim)  # prefix tokens get no position
            self.register_buffer("pos_embed", torch.cat([prefix, sincos])[None])
        self.pos_drop = nn.Dropout(drop_rate)
        rates = [drop_path_rate * i / max(depth - 1, 1) for i in range(depth)]  # stochastic depth rises with depth
        self.blocks = nn.Sequential(
            *[
                Block(embed_dim, num_heads, mlp_ratio, qkv_bias, drop_rate, attn_drop_rate, rate, init_values, qk_norm)
                for rate in rates
            ]
        )
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        self.head_dist = nn.Linear(embed_dim, num_classes) if distilled and num_classes > 0 else None
        self.frozen_features = False  # set by set_trainable("head"): the features stay in eval mode
        self.head_norm: nn.Module | None = None  # set by set_trainable("head"): MAE's BatchNorm before the head
        self.init_weights()

    def init_weights(self) -> None:
        """timm's default init: truncated normal (std 0.02) on linear weights, learned positions and the
        distillation token; normal (std 1e-6) on the class and register tokens."""
        if isinstance(self.pos_embed, nn.Parameter):
            nn.init.trunc_normal_(self.pos_embed, std=0.02)
        for token, std in ((self.cls_token, 1e-6), (self.reg_token, 1e-6)):
            if token is not None:
                nn.init.normal_(token, std=std)
        if self.dist_token is not None:
            nn.init.trunc_normal_(self.dist_token, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:  # model.qkv_bias=false: the qkv projection has none
                    nn.init.zeros_(m.bias)

    @property
    def dist_index(self) -> int:
        """Position of the distillation token: right after the class token (timm's order)."""
        return int(self.cls_token is not None)

    def prefix_tokens(self) -> torch.Tensor:
        """(1, num_prefix_tokens, D): the class, distillation and register tokens present, in that order."""
        tokens = [t for t in (self.cls_token, self.dist_token, self.reg_token) if t is not None]
        return torch.cat(tokens, dim=1) if tokens else self.pos_embed[:, :0]

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)  # (B, N, D)
        x = torch.cat([self.prefix_tokens().expand(x.shape[0], -1, -1), x], dim=1)  # (B, prefix + N, D)
        return self.pos_drop(x + self.pos_embed)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.blocks(self.embed(x)))  # (B, T, D)

    def forward_head(self, x: torch.Tensor, both_heads: bool = False):
        """Logits (B, classes) from the normed tokens (B, T, D).

        Mean pooling averages the patch tokens only (never prefix tokens, as timm). A distilled model
        returns the mean of its two heads (DeiT's inference), or with `both_heads` the pair
        (class head, distillation head) that DeiT's training loss takes.
        """
        pooled = x[:, 0] if self.pool == "cls" else x[:, self.num_prefix_tokens :].mean(dim=1)  # (B, D)
        norm = self.head_norm or nn.Identity()
        logits = self.head(norm(pooled))
        if self.head_dist is None:
            return logits
        dist = self.head_dist(norm(x[:, self.dist_index]))
        return (logits, dist) if both_heads else (logits + dist) / 2

    def forward(self, x: torch.Tensor, both_heads: bool = False):
        if self.pool == "mean":
            return self.forward_head(self.forward_features(x), both_heads)
        # The heads read only the class (and distillation) token, so the last block updates only those:
        # the other tokens still serve as keys and values, but their projection and MLP are skipped.
        read = 1 + (self.dist_token is not None)
        x = self.blocks[:-1](self.embed(x))
        return self.forward_head(self.norm(self.blocks[-1].forward_first_tokens(x, read)), both_heads)

    def train(self, mode: bool = True) -> VisionTransformer:
        super().train(mode)
        if self.frozen_features:  # linear probe: dropout and drop path stay off in the frozen features
            for name, child in self.named_children():
                if name not in ("head", "head_dist", "head_norm"):
                    child.train(False)
        return self

    def readout_weights(self) -> torch.Tensor:
        """(T,) weights over the tokens whose outputs the heads read, summing to 1: the class token,
        or the mean of the patch tokens; with a distillation token, half from it (the heads' mean)."""
        weights = torch.zeros(self.num_prefix_tokens + self.patch_embed.num_patches)
        if self.cls_token is not None:
            weights[0] = 1.0
        else:
            weights[self.num_prefix_tokens :] = 1.0 / self.patch_embed.num_patches
        if self.dist_token is not None:
            weights = weights / 2
            weights[self.dist_index] = 0.5
        return weights

    @torch.no_grad()
    def attention_maps(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Logits and every block's attention weights, each (B, heads, T, T); dropout is not applied.

        The first `num_prefix_tokens` tokens are the class, distillation and register tokens (those
        present, in that order); the rest are patches in row-major order.
        """
        x = self.embed(x)
        maps = []
        for block in self.blocks:
            x, weights = block.forward_with_weights(x)
            maps.append(weights)
        return self.forward_head(self.norm(x)), maps


def sincos_2d(grid_size: int, dim: int, temperature: float = 10000.0) -> torch.Tensor:
    """Fixed 2-D sin-cos position embeddings (MoCo v3, big_vision): (grid_size**2, dim)."""
    y, x = torch.meshgrid(torch.arange(grid_size), torch.arange(grid_size), indexing="ij")
    omega = 1.0 / temperature ** (torch.arange(dim // 4) / (dim // 4 - 1))
    y = y.flatten()[:, None] * omega[None]  # (N, dim/4)
    x = x.flatten()[:, None] * omega[None]
    return torch.cat([x.sin(), x.cos(), y.sin(), y.cos()], dim=1)


def set_grad_checkpointing(model: nn.Module, enable: bool = True) -> int:
    """Activation checkpointing per transformer block of `model` (any module holding `Block`s: a ViT,
    the MAE's encoder and decoder): each block keeps only its input in forward and recomputes its
    activations in backward (torch.utils.checkpoint, non-reentrant). The RNG state is saved and restored
    around the recomputation, so dropout and drop path draw the same masks: losses and gradients equal
    the run without it. Returns the number of blocks changed. Only when grad is enabled (not in eval)."""
    blocks = [m for m in model.modules() if isinstance(m, Block)]
    for block in blocks:
        block.grad_checkpointing = enable
    return len(blocks)


def position_kind(weights: dict[str, torch.Tensor]) -> str:
    """ "sincos2d" when the patch positions of `weights["pos_embed"]` (1, P + g*g, D) equal the fixed 2-D sin-cos
    table (models/vit.py `sincos_2d`, MoCo v3's and MAE's) to 1e-4 after some count P of prefix positions that
    are zero (as the fixed table's are), else "learned"."""
    pos = weights["pos_embed"]
    if pos.dim() != 3 or pos.shape[-1] % 4:
        return "learned"
    tokens, dim = pos.shape[1], pos.shape[2]
    prefix = (
        ("cls_token" in weights)
        + ("dist_token" in weights)
        + (weights["reg_token"].shape[1] if "reg_token" in weights else 0)
    )
    for count in range(min(prefix, tokens), -1, -1):  # the prefix positions zero, as the fixed table has them
        side = int((tokens - count) ** 0.5)
        if (
            side * side == tokens - count
            and side > 0
            and torch.allclose(pos[0, count:].float(), sincos_2d(side, dim), atol=1e-4, rtol=0)
            and not pos[0, :count].any()
        ):
            return "sincos2d"
    return "learned"
