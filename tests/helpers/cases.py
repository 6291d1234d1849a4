"""Case tables that a test parametrizes over and that cli/test_docs.py counts against what the docs state
(no test reads another test file): each table lives here once and both import it.

- ARCHITECTURE_FIELDS: objectives/test_weights_identity.py's architecture changes a loaded file must name
  (docs/finetuning.md: "forced both ways, N architecture fields").
- VIT_OPTIONS, VIT_LAYOUTS: models/test_vit_options.py's options and (pool, position embedding) layouts checked
  against timm (docs/vit-options.md: "over all N combinations").
- KILL_MOMENTS, FAST_KILL_MOMENTS: train/test_faults.py's kill -9 moments, and those in the fast suite
  (docs/reliability.md: "exact resume after kill -9 at N moments", "N cases in the fast suite").
- FLIPPED_PLACES: how many places train/test_faults.py flips bytes at, from a checkpoint's first byte to its
  last (docs/reliability.md: "(N places from the first byte to the last").
"""

from __future__ import annotations

import itertools

ARCHITECTURE_FIELDS = [  # (the student's change, the field named, whether a plain file's shapes reveal it)
    ({"num_heads": 4}, "model.num_heads=2 (here 4)", False),
    ({"depth": 3}, "model.depth=2 (here 3)", True),
    ({"embed_dim": 64, "num_heads": 2}, "model.embed_dim=32 (here 64)", True),
    ({"patch_size": 8}, "model.patch_size=4 (here 8)", True),
    ({"mlp_ratio": 4.0}, "model.mlp_ratio=2 (here 4)", True),
    ({"pool": "mean"}, "model.pool=cls (here mean)", True),
    ({"qkv_bias": False}, "model.qkv_bias=true (here false)", True),
    ({"pos_embed": "sincos2d"}, "model.pos_embed=learned (here sincos2d)", True),  # learned values: not the table
]

VIT_OPTIONS = [dict(reg_tokens=4), dict(init_values=1e-5), dict(qk_norm=True),
               dict(reg_tokens=2, init_values=0.1, qk_norm=True), dict(qkv_bias=False)]
VIT_LAYOUTS = list(itertools.product(["cls", "mean"], ["learned", "sincos2d"]))

KILL_MOMENTS = {  # fault, n (tests/helpers/killer.py): what the resumed run starts from
    "before-first-checkpoint": ("row", 2),  # nothing: a fresh start in a folder holding a log
    "temp-file-complete-not-renamed": ("tmp_done", 1),  # nothing, and a leftover last.pt.tmp
    "half-written-checkpoint": ("mid_write", 2),  # step 3, and a half last.pt.tmp
    "just-renamed": ("renamed", 1),  # step 3 (last.pt, no step_3 link yet)
    "after-val-row-before-its-checkpoint": ("val_row", 1),  # step 6; the val row of step 8 was logged
    "between-checkpoints": ("row", 11),  # step 9
    "after-the-final-checkpoint": ("results", 1),  # step 16: the run is finished but has no results.json
}
FAST_KILL_MOMENTS = ("before-first-checkpoint", "after-the-final-checkpoint")

FLIPPED_PLACES = 48
