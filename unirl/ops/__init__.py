"""Operations commands: ``unirl doctor`` (what this machine can run), ``unirl diagnose`` (failures in
logs), ``unirl runs`` and ``unirl sweep`` (run directories side by side)."""
