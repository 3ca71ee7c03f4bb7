"""The ``trl`` backend: unirl recipes run by TRL's own SFTTrainer, DPOTrainer and GRPOTrainer."""
