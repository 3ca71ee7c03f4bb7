"""The driver that runs a recipe's stages (engine mode) and what it needs."""
