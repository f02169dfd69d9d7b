"""Files gpuq ships beside its code: the pages (web/) and the schema (migrations/).

Both stay at the top of the repository; pyproject.toml maps them into the package as gpuq.web
and gpuq.store.migrations, so a wheel, an sdist and an editable install all find them by import."""

from __future__ import annotations

import importlib.resources
from pathlib import Path

from .errors import IncompleteInstall

# Where each shipped package lives in a source checkout (pyproject.toml's package-dir).
IN_CHECKOUT = {"web": "web", "store.migrations": "migrations", "store.migrations.postgres": "migrations/postgres"}


def shipped_dir(name: str) -> Path:
    """The directory of the package gpuq.<name>; where a wheel puts it when it is missing. Code
    run from a source checkout (another worktree than the one installed editable) reads that
    checkout's own pages and schema, not the installed tree's."""
    top = Path(__file__).resolve().parent.parent
    if (top / "pyproject.toml").is_file() and (top / IN_CHECKOUT[name] / "__init__.py").is_file():
        return top / IN_CHECKOUT[name]
    try:
        return Path(str(importlib.resources.files(f"gpuq.{name}")))
    except ModuleNotFoundError:  # an incomplete install: shipped_files names what is missing
        return Path(__file__).resolve().parent.joinpath(*name.split("."))


def shipped_files(directory: Path, pattern: str, what: str) -> list[Path]:
    """The files in `directory` matching `pattern`, sorted; finding none is an IncompleteInstall."""
    files = sorted(directory.glob(pattern))
    if not files:
        raise IncompleteInstall(
            f"no {what} found in {directory} ({pattern}): this gpuq installation is incomplete; reinstall gpuq"
        )
    return files
