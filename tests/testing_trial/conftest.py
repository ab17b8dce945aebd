"""These are trial's tests: ``make test`` runs them with trial after pytest.

pytest could run them too (``ModelTestMixin`` waits through pytest-twisted's reactor
greenlet: tests/testing/test_user_folder.py runs a user's file holding both kinds
under plain pytest); they are left to trial here so that they run once, and so that
trial's janitor, which fails a test case for any delayed call or socket left in the
reactor, does not judge what the suite's pytest-twisted tests left there."""

collect_ignore_glob = ["test_*.py"]
