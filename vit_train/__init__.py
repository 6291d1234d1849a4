"""vit-train: a config-driven Vision Transformer trainer."""

__version__ = "0.1.0"
