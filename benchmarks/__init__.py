"""Benchmarks: each prints measured ratios; none is a pass/fail timing test."""
