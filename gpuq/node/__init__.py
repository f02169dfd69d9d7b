"""The nodes: one worker per node runs its queue against the node's Ollama (the client), a
monitor checks its health, the dispatcher owns them all, supervision restarts a loop that dies."""
