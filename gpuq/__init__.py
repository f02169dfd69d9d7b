"""gpuq: a durable job broker for a personal GPU lab running Ollama."""

__version__ = "0.1.0"
