"""timm's VisionTransformer options, each as model.pretrained: an option the classic ViT can compute loads
with the same outputs; any other is refused in one line naming the architecture difference, nothing loaded.

A key dropped on load is another function unless the network it came from never computed with it: timm's
pre_norm (CLIP's ln_pre, and no patch-embedding bias), fc_norm, attention pooling, norms inside attention and
the MLP, final_norm=False, a projection without bias (pytorch #68553, open_clip PR #639, timm's own
checkpoint_filter_fn exists because names alone do not say this)."""

from __future__ import annotations

import pytest
import torch

from vit_train.errors import ConfigError
from vit_train.models.vit import VisionTransformer
from vit_train.objectives.weights_in import load_pretrained

timm = pytest.importorskip("timm")

SHAPE = dict(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=10)

# (timm's options, ours for the same function)
SAME = [
    ({}, {}),
    ({"qkv_bias": False}, {"qkv_bias": False}),
    ({"mlp_ratio": 2.0}, {"mlp_ratio": 2.0}),
    ({"global_pool": "avg", "class_token": False, "fc_norm": False}, {"pool": "mean"}),
    ({"init_values": 1e-2}, {"init_values": 1e-5}),  # the file's gammas replace the start value
    ({"qk_norm": True}, {"qk_norm": True}),
    ({"reg_tokens": 2}, {"reg_tokens": 2}),
    ({"no_embed_class": True}, {}),  # positions of the patches only: the class token's are zeros here
]
# (timm's options, what the one line names); the model pools as the file does (model.pool is compared first)
OTHER = [
    ({"pre_norm": True}, "a norm before the blocks (timm's pre_norm=True, CLIP's ln_pre): norm_pre.weight, "
                         "norm_pre.bias; no bias in patch_embed.proj"),
    ({"global_pool": "avg", "class_token": False}, "a norm after pooling (timm's fc_norm): fc_norm.weight, "
                                                   "fc_norm.bias; no final norm (norm.*)"),
    ({"global_pool": "avg", "fc_norm": True}, "a norm after pooling (timm's fc_norm)"),
    ({"global_pool": "map"}, "attention pooling (timm's global_pool='map'): attn_pool."),
    ({"scale_attn_norm": True}, "a norm inside attention (timm's scale_attn_norm): blocks.N.attn.norm.weight"),
    ({"scale_mlp_norm": True}, "a norm inside the MLP (timm's scale_mlp_norm): blocks.N.mlp.norm.weight"),
    ({"proj_bias": False}, "no bias in attn.proj; no bias in mlp.fc1; no bias in mlp.fc2"),
    ({"final_norm": False}, "no final norm (norm.*)"),
    ({"embed_norm_layer": "layernorm"}, "a norm after the patch embedding: patch_embed.norm.weight"),
]


def theirs(options: dict) -> torch.nn.Module:
    torch.manual_seed(0)
    net = timm.models.vision_transformer.VisionTransformer(**SHAPE, **options).eval()
    with torch.no_grad():  # no zero-initialised part: every tensor shows in the outputs
        for p in net.parameters():
            p.add_(0.02 * torch.randn_like(p))
    return net


@pytest.mark.parametrize("options, ours", SAME, ids=[str(o) for o, _ in SAME])
def test_a_timm_option_the_classic_vit_computes_loads_with_the_same_outputs(tmp_path, options, ours):
    net = theirs(options)
    torch.save(net.state_dict(), tmp_path / "timm.pth")
    model = VisionTransformer(**SHAPE, **ours).eval()
    report = load_pretrained(model, tmp_path / "timm.pth")
    assert report["ignored"] == [] and report["reinitialised"] == []
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(model(x), net(x), rtol=0, atol=1e-5)


@pytest.mark.parametrize("options, said", OTHER, ids=[str(o) for o, _ in OTHER])
def test_a_timm_option_of_another_function_is_refused_naming_it(tmp_path, options, said):
    torch.save(theirs(options).state_dict(), tmp_path / "timm.pth")
    torch.manual_seed(1)
    model = VisionTransformer(**SHAPE, pool="cls" if options.get("class_token", True) else "mean")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ConfigError) as info:
        load_pretrained(model, tmp_path / "timm.pth")
    text = str(info.value)
    assert text.startswith("model.pretrained: timm.pth is another architecture than this model: ") and said in text, text
    assert "\n" not in text and all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
