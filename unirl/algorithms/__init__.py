"""Reference algorithms: pure functions over tensors, one documented semantics each.

These are the conformance oracle: backends are checked against them, never the reverse.
"""
