"""The persistence coordinator: the ``SessionPersistence`` service (``service``) over one shared core object
(``state``), and its parts: the per-id FIFO, the write lease table, durable writes and in-doubt settlement, the
cold path, the live path with its write-behind batching window, retirement and lifecycle."""
