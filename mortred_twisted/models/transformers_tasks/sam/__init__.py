"""SAM's automatic mask generator over a transformers ``SamModel`` (the mask-generation
task's engine; torch is imported only by its modules)."""
