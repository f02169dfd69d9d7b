"""The router's HTTP API: the app factory (app.py) and its views, one module per concern."""
