"""Start from saved weights (`model.pretrained`, opened by the door in objectives/weights_in.py): a
vit-train checkpoint or run directory, safetensors, a timm or DeiT state dict (plain or distilled), or torchvision's
ViT (`vit_b_16`, `vit_l_16`, ...). From a masked-autoencoder run (objective mae) the encoder is taken
(`encoder.` prefix stripped) and its decoder dropped; the head is new.

Names are brought to timm's (ours): wrapper prefixes of DDP, DataParallel, AveragedModel
(`module.`), torch.compile (`_orig_mod.`), FSDP1 and activation checkpointing (outputs/weights.py `WRAPPERS`)
are removed at any depth and in any order, an outer
prefix (Lightning's `model.`, ...) is removed, and torchvision's names are mapped to timm's.
Keys that fit are loaded; learned position embeddings are resized by bicubic interpolation when the
patch grid differs; prefix-token positions (class, distillation, register tokens) are matched by
name; the head is left freshly initialised when the class count differs; keys this model lacks are
ignored. Any other shape mismatch is an error that names the key.

A distilled DeiT (timm's `deit_*_distilled_*`: `dist_token`, `head_dist`, two prefix positions)
loaded into a model without a distillation token: the class token, its position and `head` are
loaded; the distillation token, its position and `head_dist` are dropped (reported as ignored).
Into a distilled model (`model.distilled=true`) everything loads.

The ViT options that add tensors must agree between the file and the model, both ways: LayerScale
(`blocks.N.ls1/ls2.gamma`, model.init_values), QK-norm (`blocks.N.attn.q_norm/k_norm`, model.qk_norm)
and registers (`reg_token`, model.reg_tokens). Otherwise the model would be another network than the
one trained (its option tensors dropped, or left at their init): refused in one line naming the keys
to set. The distillation token and head are head-like: dropped or freshly initialised, and reported.
"""

from __future__ import annotations

import logging
import math
import re
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from vit_train.errors import ConfigError
from vit_train.models.vit import position_kind
from vit_train.outputs.weights import strip_wrappers

log = logging.getLogger("vit_train")

ANCHOR = "patch_embed.proj.weight"  # every ViT state dict with timm's names has it
# torchvision.models.VisionTransformer -> timm (torchvision/models/vision_transformer.py)
TORCHVISION = [
    (re.compile(p), r)
    for p, r in (
        (r"^class_token$", "cls_token"),
        (r"^conv_proj\.", "patch_embed.proj."),
        (r"^encoder\.pos_embedding$", "pos_embed"),
        (r"^encoder\.layers\.encoder_layer_(\d+)\.ln_1\.", r"blocks.\1.norm1."),
        (r"^encoder\.layers\.encoder_layer_(\d+)\.ln_2\.", r"blocks.\1.norm2."),
        (r"^encoder\.layers\.encoder_layer_(\d+)\.self_attention\.in_proj_", r"blocks.\1.attn.qkv."),  # [q; k; v] rows
        (r"^encoder\.layers\.encoder_layer_(\d+)\.self_attention\.out_proj\.", r"blocks.\1.attn.proj."),
        (r"^encoder\.layers\.encoder_layer_(\d+)\.mlp\.(?:0|linear_1)\.", r"blocks.\1.mlp.fc1."),
        (r"^encoder\.layers\.encoder_layer_(\d+)\.mlp\.(?:3|linear_2)\.", r"blocks.\1.mlp.fc2."),
        (r"^encoder\.ln\.", "norm."),
        (r"^heads\.head\.", "head."),
    )
]


def timm_names(weights: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], str]:
    """`weights` under timm's names, and which naming they came in ("timm" or "torchvision")."""
    weights = encoder_weights(strip_wrappers(weights))
    networks = [k[: -len(ANCHOR)] for k in weights if k == ANCHOR or k.endswith("." + ANCHOR)] + [
        k[: -len("conv_proj.weight")] for k in weights if k == "conv_proj.weight" or k.endswith(".conv_proj.weight")
    ]
    if len(networks) > 1:  # Lightning's model.* beside model_ema.*, DINO's student.* beside teacher.*: which one?
        raise ConfigError(
            f"model.pretrained holds {len(networks)} networks ({', '.join(p or '(no prefix)' for p in networks)}"
            f"); save the one you mean as its own state dict (its keys without the prefix) and give that"
        )
    if "conv_proj.weight" not in weights and not any(k == ANCHOR for k in weights):
        outer = next((k[: -len(ANCHOR)] for k in weights if k.endswith("." + ANCHOR)), None) or next(
            (k[: -len("conv_proj.weight")] for k in weights if k.endswith(".conv_proj.weight")), None
        )
        if outer:  # e.g. Lightning's "model.", a backbone attribute: keep what lies under it
            weights = {k[len(outer) :]: v for k, v in weights.items() if k.startswith(outer)}
    if "conv_proj.weight" not in weights:
        return weights, "timm"
    renamed = {}
    for key, value in weights.items():
        for pattern, repl in TORCHVISION:
            if pattern.search(key):
                key = pattern.sub(repl, key)
                break
        renamed[key] = value
    return renamed, "torchvision"


def prefix_names(tokens: dict[str, torch.Tensor | None]) -> list[str]:
    """Names of the prefix tokens in timm's order (class, distillation, registers) from their tensors."""
    names = ["cls"] * (tokens.get("cls_token") is not None) + ["dist"] * (tokens.get("dist_token") is not None)
    reg = tokens.get("reg_token")
    return names + [f"reg{i}" for i in range(reg.shape[1] if reg is not None else 0)]


def resize_pos_embed(pos: torch.Tensor, num_prefix: int, grid: int, source_prefix: int | None = None) -> torch.Tensor:
    """Position embeddings (1, P + g*g, D) resized to `num_prefix` prefix tokens and a grid x grid patch grid.

    The source's prefix count P is `source_prefix`, or when not given read from its length (0 or 1
    class token); prefix positions are kept, dropped or added as zeros to match `num_prefix`.
    """
    tokens, dim = pos.shape[1], pos.shape[2]
    if source_prefix is None:
        source_prefix = 0 if math.isqrt(tokens) ** 2 == tokens else 1
    side = math.isqrt(tokens - source_prefix)
    if side * side != tokens - source_prefix:
        raise ConfigError(
            f"pretrained pos_embed has {tokens} positions, {tokens - source_prefix} after its "
            f"{source_prefix} prefix positions, which is no square patch grid; this ViT's patch "
            f"grid is square, so its positions cannot be matched"
        )
    prefix, patches = pos[:, :source_prefix], pos[:, source_prefix:]
    if side != grid:
        patches = patches.reshape(1, side, side, dim).permute(0, 3, 1, 2).float()
        patches = F.interpolate(patches, size=(grid, grid), mode="bicubic", align_corners=False, antialias=side > grid)
        patches = patches.permute(0, 2, 3, 1).reshape(1, grid * grid, dim).to(pos.dtype)
    prefix = prefix[:, :num_prefix] if source_prefix >= num_prefix else torch.zeros(1, num_prefix, dim, dtype=pos.dtype)
    return torch.cat([prefix, patches], dim=1)


def map_pos_embed(
    pos: torch.Tensor, source: list[str], target: list[str], grid: int, source_grid: int | None = None
) -> torch.Tensor:
    """Positions for the `target` prefix tokens (matched by name; zeros where the source has none)
    and a grid x grid patch grid, from positions of the `source` prefix tokens and a square grid.
    A source whose positions cover only the patches (timm's no_embed_class) has zeros for its tokens.
    `source_grid`: the source's patch grid side when known (a vit-train file's config); without it, positions
    that read as a square grid both with and without the prefix positions are refused (ConfigError)."""
    tokens, dim = pos.shape[1], pos.shape[2]
    readings = [n for n in dict.fromkeys((len(source), 0)) if tokens >= n and math.isqrt(tokens - n) ** 2 == tokens - n]
    if source_grid is not None:  # a vit-train file's recorded image and patch size decide
        readings = [n for n in readings if tokens - n == source_grid**2] or readings
    if len(readings) > 1:  # 9 positions with 5 prefix tokens: 3x3 patches, or 5 prefix positions and 2x2
        sides = [math.isqrt(tokens - n) for n in readings]
        raise ConfigError(
            f"model.pretrained: pos_embed's {tokens} positions read two ways: a {sides[0]}x{sides[0]} "
            f"patch grid after positions for its {len(source)} prefix tokens ({', '.join(source)}), or "
            f"a {sides[1]}x{sides[1]} grid without them (timm's no_embed_class); its tensors cannot tell "
            f"which, and a guess would load another function: give a vit-train checkpoint or export "
            f"(they record the image size), or save the weights from timm at another image size"
        )
    embedded = readings[0] if readings else None
    if embedded is None:
        raise ConfigError(
            f"pretrained pos_embed has {tokens} positions, which is no square patch grid after its "
            f"{len(source)} prefix tokens ({', '.join(source) or 'none'}) nor without them; this "
            f"ViT's patch grid is square, so its positions cannot be matched"
        )
    rows = dict(zip(source, pos[0, :embedded], strict=False)) if embedded else {}
    prefix = torch.stack([rows.get(name, pos.new_zeros(dim)) for name in target])[None] if target else pos[:, :0]
    patches = resize_pos_embed(pos[:, embedded:], 0, grid, source_prefix=0)
    return torch.cat([prefix, patches], dim=1)


def encoder_weights(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A masked autoencoder's state dict (encoder.*, decoder.*) -> its encoder's, as a VisionTransformer's;
    any other state dict unchanged."""
    if not any(k.startswith("encoder.") for k in weights) or not any(k.startswith("decoder.") for k in weights):
        return weights
    encoder = {k.removeprefix("encoder."): v for k, v in weights.items() if k.startswith("encoder.")}
    log.info(
        "model.pretrained holds a masked autoencoder: its encoder is loaded, its decoder (%d tensors) dropped",
        len(weights) - len(encoder),
    )
    return encoder


LAYER_SCALE = re.compile(r"^blocks\.\d+\.ls[12]\.gamma$")
QK_NORM = re.compile(r"^blocks\.\d+\.attn\.[qk]_norm\.")
HEADS = ("head.", "head_dist.", "fc.")  # the ViT's heads, a ResNet's classifier
# what may start fresh when a file lacks it: the heads, a distillation token the file never had, a probe's norm
FRESH_OK = HEADS + ("dist_token", "head_norm.")
OFF = {"model.init_values": "null", "model.qk_norm": "false", "model.reg_tokens": "0"}


def vit_options(weights: dict[str, torch.Tensor]) -> dict[str, tuple[str | None, str]]:
    """The tensor-adding ViT options a state dict (timm's names) was built with: model.* key -> (its value
    as the command line writes it, None when off; the tensors that show it)."""
    reg = weights.get("reg_token")
    return {
        "model.init_values": (
            "set" if any(LAYER_SCALE.match(k) for k in weights) else None,
            "blocks.N.ls1.gamma, blocks.N.ls2.gamma",
        ),
        "model.qk_norm": (
            "true" if any(QK_NORM.match(k) for k in weights) else None,
            "blocks.N.attn.q_norm.*, blocks.N.attn.k_norm.*",
        ),
        "model.reg_tokens": (str(reg.shape[1]) if reg is not None and reg.shape[1] else None, "reg_token"),
    }


def check_options(weights: dict[str, torch.Tensor], own: dict[str, torch.Tensor], config: dict | None) -> None:
    """Refuse (ConfigError, one line) weights whose LayerScale, QK-norm or register tokens differ from the
    model's: dropping them or starting them at their init would train another network than the one the file
    holds. `config`: the file's run config when it has one (vit-train checkpoints, vit-export), for the value
    of model.init_values (any number works: the loaded gammas replace it)."""
    if not any(k.startswith("blocks.") for k in own):  # not a ViT (a ResNet): none of these options exist
        return
    theirs, ours = vit_options(weights), vit_options(own)
    trained = ((config or {}).get("model") or {}).get("init_values")
    fix, said = [], []
    for key, (value, tensors) in theirs.items():
        if value == ours[key][0]:
            continue
        if value is None:  # the model would start these at their init inside a trained network
            said.append(f"without {key} (no {tensors})")
            fix.append(f"{key}={OFF[key]}")
            continue
        known = True
        if key == "model.init_values":  # a timm file has no config: any number works, the file's gammas replace it
            known = isinstance(trained, (int, float)) and trained != 0
            value = f"{trained:g}" if known else "1e-5"
        said.append(f"with {key}={value} (its {tensors})" if known else f"with {key} set (its {tensors})")
        fix.append(f"{key}={value}")
    if said:
        raise ConfigError(
            f"model.pretrained was trained {' and '.join(said)}; set {' '.join(fix)} to load it "
            f"(the option-tensors must match, else the model is another network than the one trained)"
        )


# tensors no forward of the loaded network computes with: a distillation head and token (dropped, reported),
# an MAE's mask token and decoder
UNUSED_OK = ("dist_token", "head_dist.", "mask_token", "decoder_", "decoder.")
# parts of a timm ViT this ViT (the classic one) has no option for: name prefix or pattern -> what they compute
PARTS = [
    (re.compile(p), what)
    for p, what in (
        (r"^norm_pre\.", "a norm before the blocks (timm's pre_norm=True, CLIP's ln_pre)"),
        (r"^patch_embed\.norm\.", "a norm after the patch embedding"),
        (r"^fc_norm\.", "a norm after pooling (timm's fc_norm)"),
        (r"^attn_pool\.", "attention pooling (timm's global_pool='map')"),
        (r"^head\.(?:norm|fc|pre_logits)\.", "a head with its own norm or hidden layer (timm's NormMlpClassifierHead)"),
        (r"^blocks\.\d+\.attn\.norm\.", "a norm inside attention (timm's scale_attn_norm)"),
        (r"^blocks\.\d+\.mlp\.norm\.", "a norm inside the MLP (timm's scale_mlp_norm)"),
    )
]
BIASES = re.compile(r"^(?:blocks\.\d+\.)?(attn\.qkv|attn\.proj|mlp\.fc1|mlp\.fc2|patch_embed\.proj)\.bias$")


def check_function(
    weights: dict[str, torch.Tensor],
    own: dict[str, torch.Tensor],
    ignored: list[str],
    fresh: list[str],
    fixed_pos: bool,
    name: str,
) -> None:
    """Refuse (ConfigError, one line naming the architecture difference) weights whose network computes another
    function than this model would with them: a tensor ignored that the file's network computes with (a part
    this ViT lacks: pre-norm, a norm after pooling, ...; learned positions into fixed ones), or a tensor of
    this network the file lacks, outside the heads and tokens that start fresh (a missing bias, no final norm,
    no positions). Ignored and kept: heads, and `UNUSED_OK` (distillation, an MAE's mask token and decoder)."""
    found, fix = [], []
    for pattern, what in PARTS:
        keys = [k for k in ignored if pattern.match(k)]
        if keys and what not in found:
            found.append(f"{what}: {_pattern(keys)}")
    if fixed_pos and "pos_embed" not in weights:
        found.append("no position embeddings (pos_embed; this model adds fixed sin-cos ones)")
    elif "pos_embed" in ignored and fixed_pos and position_kind(weights) == "learned":
        found.append("learned position embeddings (pos_embed; this model's are fixed sin-cos)")
        fix.append("model.pos_embed=learned")
    if any(k.endswith("attn.qkv.bias") for k in ignored):
        found.append(
            f"a bias in the query/key/value projection ({_pattern([k for k in ignored if k.endswith('attn.qkv.bias')])})"
        )
        fix.append("model.qkv_bias=true")
    told = {k for k in ignored if any(p.match(k) for p, _ in PARTS) or k.endswith("attn.qkv.bias") or k == "pos_embed"}
    other = [
        k for k in ignored if k not in told and k in weights and not k.startswith(UNUSED_OK + HEADS) and k not in own
    ]
    missing = [k for k in fresh if not k.startswith(FRESH_OK)]
    # a layer built without a bias (CLIP's patch embedding, proj_bias=False): its bias missing beside its weight
    # wherever the weight is; one block's bias alone missing is a cut file, not an architecture
    without = _unbiased_layers(weights)
    unbiased = [k for k in missing if (m := BIASES.match(k)) and m.group(1) in without]
    biases = sorted({BIASES.match(k).group(1) for k in unbiased})
    found += [f"no bias in {b}" for b in biases]
    if "attn.qkv" in biases:
        fix.append("model.qkv_bias=false")
    no_norm = not any(k.startswith("norm.") for k in weights)  # some of it there: a cut file
    if no_norm and any(k.startswith("norm.") for k in missing):
        found.append("no final norm (norm.*)")
    if "pos_embed" in missing:
        found.append("no position embeddings (pos_embed)")
    rest = [k for k in missing if k not in unbiased and not (no_norm and k.startswith("norm.")) and k != "pos_embed"]
    if not found and rest:  # the same architecture with tensors cut out: they would start at their init
        raise ConfigError(
            f"model.pretrained: {name} lacks {len(rest)} trained tensors of this network "
            f"({', '.join(rest[:4])}{', ...' if len(rest) > 4 else ''}); they would start at their "
            f"init inside trained weights: the file is cut or edited, give the whole state dict"
        )
    if not found and other:  # names no known ViT part has: whether its network computed with them is unknown
        raise ConfigError(
            f"model.pretrained: {name} holds tensors this ViT has no place for ({_pattern(other)}); "
            f"if its network computed with them, loading without them is another function, so they "
            f"are not dropped unasked: save the state dict without them if they are not part of it "
            f"(a training tool's extras)"
        )
    if other:
        found.append(f"tensors this ViT has no place for ({_pattern(other)})")
    if not found:
        return
    if len(fix) == len(found):
        raise ConfigError(
            f"model.pretrained: {name} is another architecture than this model: {'; '.join(found)}; "
            f"set {' '.join(fix)} to load it (loaded as it is it would compute another function)"
        )
    raise ConfigError(
        f"model.pretrained: {name} is another architecture than this model: {'; '.join(found)}; "
        f"loading it would compute another function, and this ViT (the classic one) cannot compute that "
        f"network: give weights of a classic ViT (timm's VisionTransformer with its defaults, DeiT, "
        f"torchvision, vit-train)"
    )


def _unbiased_layers(weights: dict[str, torch.Tensor]) -> set[str]:
    """The layers of `BIASES` (attn.qkv, attn.proj, mlp.fc1, mlp.fc2, patch_embed.proj) whose weights are in
    `weights` and whose biases are nowhere beside them."""
    has: dict[str, list[bool]] = {}
    for key in weights:
        if key.endswith(".weight") and (m := BIASES.match(key.removesuffix("weight") + "bias")):
            has.setdefault(m.group(1), []).append(key.removesuffix("weight") + "bias" in weights)
    return {layer for layer, present in has.items() if not any(present)}


def _pattern(keys: list[str]) -> str:
    """Keys as few patterns: block indices written N ("blocks.N.attn.norm.weight"), at most 4 shown."""
    names = list(dict.fromkeys(re.sub(r"^blocks\.\d+\.", "blocks.N.", k) for k in keys))
    return ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")


def fit_pretrained(
    model: nn.Module,
    weights: dict[str, torch.Tensor],
    source: str,
    config: dict | None,
    label: str,
    new_head: bool = False,
) -> dict[str, list[str]]:
    """Load what fits of `weights` (timm's names: `timm_names`; `source` is the naming they came in) into
    `model`; returns (and logs) what happened to each key. `config`: the file's run config when it has
    one; `label`: the file, for messages; `new_head`: re-initialise the classifier heads (head, head_dist,
    a ResNet's fc) even where they fit, as fine-tuning to new classes does. Which weights come in, and
    whether the architecture and the classes agree, is the door's (objectives/weights_in.py).

    Raises ConfigError (one line, nothing loaded) for a shape that does not fit, weights of no ViT,
    option-tensors (LayerScale, QK-norm, registers) the file and the model do not share, and weights of
    another function (`check_function`: a key ignored that the file's network computes with, or one of this
    network's the file lacks)."""
    path = Path(label)
    own = model.state_dict()
    pos = getattr(model, "pos_embed", None)  # a Parameter (learned), a buffer (fixed sin-cos), or none (a ResNet)
    fixed_pos = isinstance(pos, torch.Tensor) and not isinstance(pos, torch.nn.Parameter)
    source_tokens, own_tokens = prefix_names(weights), prefix_names(dict(model.named_parameters()))
    report: dict[str, list[str]] = {"loaded": [], "resized": [], "reinitialised": [], "ignored": []}
    chosen = {}
    for key, value in weights.items():
        if key not in own or (key == "pos_embed" and fixed_pos):
            report["ignored"].append(key)
        elif key == "pos_embed" and (value.shape != own[key].shape or source_tokens != own_tokens):
            chosen[key] = map_pos_embed(
                value, source_tokens, own_tokens, model.patch_embed.grid_size, _recorded_grid(config)
            )
            report["resized"].append(f"pos_embed {tuple(value.shape)} -> {tuple(own[key].shape)}")
        elif new_head and key.startswith(HEADS):
            fits = value.shape == own[key].shape
            report["reinitialised"].append(
                f"{key} (model.reset_head=true)"
                if fits
                else f"{key} ({value.shape[0]} classes in the file, {own[key].shape[0]} here)"
            )
        elif value.shape == own[key].shape:
            chosen[key] = value
            report["loaded"].append(key)
        elif key == "reg_token":  # another register count: check_options names model.reg_tokens below
            continue
        elif key.startswith(HEADS):  # the ViT's heads, a ResNet's classifier
            report["reinitialised"].append(f"{key} ({value.shape[0]} classes in the file, {own[key].shape[0]} here)")
        else:
            raise ConfigError(
                f"model.pretrained: {key} has shape {tuple(value.shape)} in {path.name} but "
                f"{tuple(own[key].shape)} in this model; set the model's embed_dim, depth, num_heads, "
                f"mlp_ratio and patch_size to those of the weights"
            )
    skipped = {k.split(" ")[0] for k in report["reinitialised"]}
    fresh = [k for k in own if k not in weights and k not in skipped and not (k == "pos_embed" and fixed_pos)]
    report["reinitialised"] += fresh
    if not report["loaded"]:
        names = ", ".join(list(weights)[:4])
        raise ConfigError(
            f"model.pretrained: no tensor in {path} fits this model: it holds {len(weights)} tensors "
            f"named like {names}, not ViT weights from vit-train, timm, DeiT or torchvision"
        )
    check_options(weights, own, config)
    check_function(weights, own, report["ignored"], fresh, fixed_pos, path.name)
    model.load_state_dict(chosen, strict=False)
    distill = (
        " (a distillation token and head: model.distilled=true keeps them)" if "dist_token" in report["ignored"] else ""
    )
    log.info(
        "pretrained weights from %s (%s names): %d tensors loaded; resized: %s; re-initialised: %s; ignored: %s%s",
        path,
        source,
        len(report["loaded"]),
        ", ".join(report["resized"]) or "none",
        ", ".join(report["reinitialised"]) or "none",
        ", ".join(report["ignored"]) or "none",
        distill,
    )
    return report


def _recorded_grid(config: dict | None) -> int | None:
    """The patch grid side a vit-train file's config records (model.img_size // model.patch_size), else None."""
    model = (config or {}).get("model") or {}
    size, patch = model.get("img_size"), model.get("patch_size")
    return size // patch if isinstance(size, int) and isinstance(patch, int) and patch > 0 else None


def at_size(model: nn.Module, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`weights` with pos_embed fitted to `model`'s patch grid: learned positions resized (bicubic, prefix
    positions kept), a fixed sin-cos table replaced by the model's own."""
    own = model.state_dict().get("pos_embed")
    if own is None or weights["pos_embed"].shape == own.shape:
        return weights
    if not isinstance(model.pos_embed, torch.nn.Parameter):
        return {**weights, "pos_embed": own}
    pos = resize_pos_embed(
        weights["pos_embed"],
        model.num_prefix_tokens,
        model.patch_embed.grid_size,
        source_prefix=model.num_prefix_tokens,
    )
    return {**weights, "pos_embed": pos}
