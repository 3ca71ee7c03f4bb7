"""The recipe: OmegaConf structured schema, loading, overrides and validation."""

from unirl.config.loader import load_recipe

__all__ = ["load_recipe"]
