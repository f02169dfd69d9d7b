"""PostgreSQL's schema migrations, shipped inside the package as gpuq.store.migrations.postgres:
see pyproject.toml and gpuq/store/postgres.py."""
