"""Testing served models: in process, in memory, under pytest and trial."""
