"""The persistence coordinator: the ``SessionPersistence`` service (``service``) over one shared core object
(``state``, which also keeps the backend's resolved primitives and the writer lease table), and its parts: the
per-id FIFO, durable writes and in-doubt settlement, the cold path, the live path with its write-behind batching
window, retirement and lifecycle."""
