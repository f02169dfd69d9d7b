"""The Ollama simulator behind `gpuq serve --demo` and the tests: Ollama's HTTP, as its source
has it, on loopback."""

from .server import FakeOllama, Script

__all__ = ["FakeOllama", "Script"]
