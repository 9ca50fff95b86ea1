"""The transcript format, in one place: the bytes of a session log and every rule that reads or writes them.

v0 and v1 side by side. ``records`` (the header line), ``bounded`` (decompression under a cap) and ``frames`` (zstd
framing, the ``Compression`` kinds) serve both. ``v0`` reads the first format (checksummed zstd frames or plain
lines, no declarations); ``v1`` writes and walks declared batches (``v1_declarations``), ``v1_damage`` finds a
damaged final batch; ``upgrade`` re-encodes a v0 log as v1 on its first write; ``salvage`` reads what precedes
damage. Nothing here opens a file by path: that is ``_files``.
"""
