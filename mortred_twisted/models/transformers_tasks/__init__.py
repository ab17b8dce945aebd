"""``type = "transformers"``: vision checkpoints served by task (see :mod:`.loader`)."""
