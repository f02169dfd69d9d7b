"""The front door: a second listener that answers as Ollama does (its OpenAI, Responses and
Anthropic routes included), one registry of its endpoints, and the translations between them."""
