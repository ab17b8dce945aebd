"""mortred-twisted."""
