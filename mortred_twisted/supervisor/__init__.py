"""The supervisor: restart policy (pure), child processes, readiness monitor, logs."""
