"""Transcripts as files under a root: the layout of paths (``layout``), durable POSIX steps (``fs``), the writer
lease (``lease``) and its held append descriptor (``held_append``), finding transcripts (``discovery``), lifecycle
primitives (``lifecycle``), the next-seq cache (``seq_guard``) and streaming reads of a v1 file (``stream``).
The bytes inside a file are ``_format``'s."""
