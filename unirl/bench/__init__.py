"""``unirl bench``: the same recipe on several backends, side by side, phase by phase."""
