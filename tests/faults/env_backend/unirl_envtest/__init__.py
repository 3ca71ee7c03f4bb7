"""A backend package for tests/test_env_ranks.py: ranks that echo, sleep, raise or die, run by
unirl.distributed.env_worker under a Python given as the backend's environment."""
