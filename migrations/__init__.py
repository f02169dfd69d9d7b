"""The schema migrations, shipped inside the package as gpuq.migrations: see pyproject.toml."""
