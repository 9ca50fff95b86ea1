"""The event log model: events, the session header, errors, the lossless JSON boundary, turn validation and
crash repair. The lowest wing: it imports nothing else of the core."""
