"""The Vision Transformer (Dosovitskiy et al. 2021), with timm's parameter names.

Image -> patches (strided conv) -> tokens (+ class token) + position embeddings -> pre-norm blocks
(multi-head self-attention, GELU MLP, each with a residual) -> final norm -> pool -> linear head.
Names match timm's `VisionTransformer`, so state dicts move between the two without conversion.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops import StochasticDepth

from .config import ModelConfig


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
    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True, attn_drop: float = 0.0,
                 proj_drop: float = 0.0):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.attn_drop = attn_drop
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self._split_heads(x)
        drop = self.attn_drop if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=drop)  # (B, heads, N, head_dim)
        return self._merge_heads(out)

    def forward_first_query(self, x: torch.Tensor) -> torch.Tensor:
        """The output at token 0 only (B, 1, C): token 0 queries, every token is key and value."""
        q, k, v = self._split_heads(x)
        drop = self.attn_drop if self.training else 0.0
        return self._merge_heads(F.scaled_dot_product_attention(q[:, :, :1], k, v, dropout_p=drop))

    def forward_with_weights(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The explicit path: also returns the attention weights (B, heads, N, N), for maps."""
        q, k, v = self._split_heads(x)
        weights = (q @ k.transpose(-2, -1) * self.head_dim**-0.5).softmax(dim=-1)
        return self._merge_heads(weights @ v), weights

    def _split_heads(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return qkv.unbind(0)  # 3 x (B, heads, N, head_dim)

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


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float, qkv_bias: bool, drop: float,
                 attn_drop: float, drop_path: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, num_heads, qkv_bias, attn_drop, drop)
        self.drop_path1 = StochasticDepth(drop_path, mode="row")
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop)
        self.drop_path2 = StochasticDepth(drop_path, mode="row")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path1(self.attn(self.norm1(x)))
        return x + self.drop_path2(self.mlp(self.norm2(x)))

    def forward_first_token(self, x: torch.Tensor) -> torch.Tensor:
        """The block's output at token 0 only (B, 1, D); the same values forward() gives there."""
        first = x[:, :1] + self.drop_path1(self.attn.forward_first_query(self.norm1(x)))
        return first + self.drop_path2(self.mlp(self.norm2(first)))

    def forward_with_weights(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out, weights = self.attn.forward_with_weights(self.norm1(x))
        x = x + out
        return x + self.mlp(self.norm2(x)), weights


class VisionTransformer(nn.Module):
    def __init__(self, img_size: int = 224, patch_size: int = 16, in_chans: int = 3,
                 num_classes: int = 1000, embed_dim: int = 768, depth: int = 12, num_heads: int = 12,
                 mlp_ratio: float = 4.0, qkv_bias: bool = True, pool: str = "cls",
                 pos_embed: str = "learned", drop_rate: float = 0.0, attn_drop_rate: float = 0.0,
                 drop_path_rate: float = 0.0):
        super().__init__()
        self.pool = pool
        self.num_classes = num_classes
        self.patch_embed = PatchEmbed(img_size, patch_size, in_chans, embed_dim)
        self.num_prefix_tokens = 1 if pool == "cls" else 0
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if pool == "cls" else None
        num_tokens = self.patch_embed.num_patches + self.num_prefix_tokens
        if pos_embed == "learned":
            self.pos_embed = nn.Parameter(torch.zeros(1, num_tokens, embed_dim))
        else:  # fixed; a buffer keeps the state-dict key and shape that timm expects
            sincos = sincos_2d(self.patch_embed.grid_size, embed_dim)
            prefix = torch.zeros(self.num_prefix_tokens, embed_dim)  # the class token gets no position
            self.register_buffer("pos_embed", torch.cat([prefix, sincos])[None])
        self.pos_drop = nn.Dropout(drop_rate)
        rates = [drop_path_rate * i / max(depth - 1, 1) for i in range(depth)]  # stochastic depth rises with depth
        self.blocks = nn.Sequential(*[
            Block(embed_dim, num_heads, mlp_ratio, qkv_bias, drop_rate, attn_drop_rate, rate) for rate in rates
        ])
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        self.init_weights()

    def init_weights(self) -> None:
        """timm's default init: truncated normal (std 0.02) on linear weights and learned positions."""
        if isinstance(self.pos_embed, nn.Parameter):
            nn.init.trunc_normal_(self.pos_embed, std=0.02)
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=1e-6)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)  # (B, N, D)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)  # (B, 1 + N, D)
        return self.pos_drop(x + self.pos_embed)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.blocks(self.embed(x)))  # (B, T, D)

    def forward_head(self, x: torch.Tensor) -> torch.Tensor:
        x = x[:, 0] if self.pool == "cls" else x.mean(dim=1)  # (B, D)
        return self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pool == "mean":
            return self.forward_head(self.forward_features(x))
        # The head reads only the class token, so the last block updates only that token: the
        # other tokens still serve as keys and values, but their projection and MLP are skipped.
        x = self.blocks[:-1](self.embed(x))
        return self.head(self.norm(self.blocks[-1].forward_first_token(x))[:, 0])

    @torch.no_grad()
    def attention_maps(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Logits and every block's attention weights, each (B, heads, T, T); dropout is not applied.

        Token 0 is the class token when pool == 'cls'; the rest are patches in row-major order.
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


def build_model(cfg: ModelConfig, num_classes: int) -> VisionTransformer:
    return VisionTransformer(
        img_size=cfg.img_size, patch_size=cfg.patch_size, num_classes=num_classes,
        embed_dim=cfg.embed_dim, depth=cfg.depth, num_heads=cfg.num_heads, mlp_ratio=cfg.mlp_ratio,
        qkv_bias=cfg.qkv_bias, pool=cfg.pool, pos_embed=cfg.pos_embed, drop_rate=cfg.dropout,
        attn_drop_rate=cfg.attn_dropout, drop_path_rate=cfg.drop_path,
    )
