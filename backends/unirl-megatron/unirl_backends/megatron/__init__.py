"""``backend=megatron``: Megatron-core GPTModel with tensor, pipeline and data parallel layouts (docs/backends/megatron.md)."""
