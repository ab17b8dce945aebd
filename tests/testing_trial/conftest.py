"""These are trial's tests: ``make test`` runs them with trial after pytest."""

collect_ignore_glob = ["test_*.py"]
