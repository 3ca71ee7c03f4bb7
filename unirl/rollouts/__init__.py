"""Rollout engines every engine-mode backend can use (``rollout.name``)."""
