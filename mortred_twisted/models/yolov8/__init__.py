"""YOLOV8: our own detector network and its family (see docs/models/perception.md;
torch is imported only by its modules)."""
