"""``backend=accelerate``: unirl's reference losses on models stepped by Hugging Face Accelerate."""
