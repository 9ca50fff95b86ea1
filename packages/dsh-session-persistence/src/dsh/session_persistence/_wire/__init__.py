"""The wire: the one codec. Every storage-line, chunk-row, format-version and contiguity rule lives here once;
it imports only the model."""
