"""The testing harness under trial (``trial tests.testing_trial``; make test runs it
after pytest). pytest does not collect this package (see its conftest)."""
