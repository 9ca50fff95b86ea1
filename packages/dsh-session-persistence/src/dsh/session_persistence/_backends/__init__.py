"""Storage seen from the core: the backend protocol and its value types (its optional primitives included), paged
listing, and the in-memory backend."""
