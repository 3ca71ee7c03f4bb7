"""Built-in tasks: small verifiable problems for CPU runs and tests."""
