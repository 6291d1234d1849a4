"""The typed run config (schema.py), its combination checks (checks.py) and the warnings for keys the
chosen options ignore (unused_keys.py). No torch: a bad config fails in milliseconds."""

from vit_train.config.schema import Config  # noqa: F401  (the public name: `from vit_train.config import Config`)
