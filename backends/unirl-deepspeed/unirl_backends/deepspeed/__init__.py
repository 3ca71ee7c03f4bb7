"""The ``deepspeed`` backend: unirl's reference losses on DeepSpeed engines (ZeRO 0-3, offload) over data-parallel ranks."""
