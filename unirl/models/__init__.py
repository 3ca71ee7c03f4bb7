"""Model construction: the tiny local model and loading of any HF model directory."""
