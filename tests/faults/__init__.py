"""Test-only fault injection: entry points a test starts in a child process instead of the real one.

Each wraps the real entry point after monkeypatching one function of unirl in that process, so
production code carries no test switch (``tests/test_reliability.py`` checks that no module under
``unirl/`` reads a ``UNIRL_TEST_*`` variable). ``slow_checkpoint`` runs ``python -m``, from the
repository root; the ``vllm_worker_*`` scripts run under the vLLM environment's Python, where unirl is
not installed, so they load the real worker from its file.
"""
