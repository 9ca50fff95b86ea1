"""The plugin host and the live session: the pluggy façade with one typed method per hook, the hook
specifications, the live :class:`Session` and its store, the boundary values and fork rules."""
