"""The schema migrations, shipped inside the package as gpuq.store.migrations: see pyproject.toml."""
