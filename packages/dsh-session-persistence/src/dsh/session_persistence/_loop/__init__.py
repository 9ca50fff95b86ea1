"""The reference agent loop: its protocols, the tool half of a step, the boundary runtime, tool schemas, the turn
result, and the front door that opens a store and creates, resumes or forks agents."""
