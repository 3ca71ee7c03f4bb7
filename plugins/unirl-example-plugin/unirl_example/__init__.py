"""Example unirl plugin: a digit-reversal task and a partial-credit reward."""
