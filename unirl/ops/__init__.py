"""Operations commands: ``unirl doctor`` (what this machine can run), ``unirl diagnose`` (failures in
logs), ``unirl report`` (a run in one page, incidents included), ``unirl launch`` (Slurm, Kubernetes,
Ray, local), ``unirl runs`` and ``unirl sweep`` (run directories side by side)."""
