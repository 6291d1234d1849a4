"""Where a ViT looks, as tensors: the attention its pooled output pays to each patch per layer and
head, attention rollout over all layers (Abnar and Zuidema 2020), and the similarity of the learned
positions. Needs only torch; visualize.py draws them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def default_readout(num_prefix: int, tokens: int) -> torch.Tensor:
    """The readout of a model with a class token first (num_prefix > 0) or mean pooling (no prefix)."""
    weights = torch.zeros(tokens)
    if num_prefix:
        weights[0] = 1.0
    else:
        weights[:] = 1.0 / tokens
    return weights


def pooled_attention(maps: list[torch.Tensor], num_prefix: int, readout: torch.Tensor | None = None) -> torch.Tensor:
    """(B, layers, heads, patches): the attention the pooled output pays to each patch.

    `readout` (T,) weights the query rows: the model's `readout_weights()`, e.g. the class token's
    row, the mean of the class and distillation tokens' rows, or with mean pooling the mean of the
    patch rows. Default: the class token's row when there is a prefix, else the mean of all rows.
    The prefix tokens' columns (class, distillation, registers) are left out.
    """
    stacked = torch.stack(maps, dim=1)  # (B, L, H, T, T)
    if readout is None:
        readout = default_readout(num_prefix, stacked.shape[-1])
    rows = torch.einsum("t,blhts->blhs", readout.to(stacked), stacked)
    return rows[..., num_prefix:]


def attention_rollout(maps: list[torch.Tensor], num_prefix: int, readout: torch.Tensor | None = None) -> torch.Tensor:
    """Attention rollout (Abnar and Zuidema 2020) over all layers: (B, patches), each row summing to 1.

    Each layer's head-averaged attention gets the residual connection as 0.5 A + 0.5 I, rows are
    renormalised, and the layers are multiplied from the first to the last; the result's rows are
    weighted by `readout` (as in `pooled_attention`) and read over the patches, renormalised.
    """
    result = None
    for weights in maps:
        a = weights.mean(dim=1)  # (B, T, T)
        a = 0.5 * a + 0.5 * torch.eye(a.shape[-1], device=a.device, dtype=a.dtype)
        a = a / a.sum(dim=-1, keepdim=True)
        result = a if result is None else a @ result
    if readout is None:
        readout = default_readout(num_prefix, result.shape[-1])
    row = readout.to(result) @ result  # (B, T)
    patches = row[:, num_prefix:]
    return patches / patches.sum(dim=-1, keepdim=True)


def position_similarity(pos_embed: torch.Tensor, num_prefix: int) -> torch.Tensor:
    """(patches, patches) cosine similarity between the patch positions' embeddings."""
    pos = F.normalize(pos_embed[0, num_prefix:].float(), dim=-1)
    return pos @ pos.T
