"""Storage seen from the core: the backend protocol and its value types, paged listing, which optional primitives
a backend has, and the in-memory backend."""
