"""The job stores behind :class:`~mortred_twisted.jobs.store.JobStore` (the contract,
pure, in ``jobs/``): the memory store (the ledger of one process) and the Redis store
shared by the replicas of a model id, with its link (connection keeper, watchdog,
TLS), RESP client, job wire format, progress coalescing and Lua scripts (``lua/``)."""
