"""The openrlhf backend: OpenRLHF 0.11.2 losses, KL and advantages on a DeepSpeed engine."""
