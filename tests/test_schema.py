"""The whole schema after every migration, compared with the checked-in tests/schema.sql, so a
rebuild of a table cannot drop an index, a trigger or a view unnoticed (SQLite drops them with
the table, silently). A change to the schema is made on purpose by a new migration and by
regenerating the snapshot:

    .venv/bin/python tests/test_schema.py        # writes tests/schema.sql; review its diff
"""

from __future__ import annotations

import difflib
import re
import sqlite3
import sys
from pathlib import Path

from gpuq.shipped import shipped_files
from gpuq.store import MIGRATIONS_DIR, STALE_SQL
from gpuq.store import sqlite as engine

SNAPSHOT = Path(__file__).with_name("schema.sql")
REGENERATE = ".venv/bin/python tests/test_schema.py"


def migrated(path: Path, up_to: int | None = None) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None)
    files = shipped_files(MIGRATIONS_DIR, "[0-9][0-9][0-9]_*.sql", "migrations")
    engine.migrate(db, [f for f in files if up_to is None or int(f.name[:3]) <= up_to], 0.0, path)
    return db


def normalised(sql: str | None) -> str:
    """Each line with its runs of whitespace made one space, blank lines dropped."""
    lines = (re.sub(r"\s+", " ", line).strip() for line in (sql or "").splitlines())
    return "\n".join(line for line in lines if line)


def schema_of(db: sqlite3.Connection) -> str:
    """sqlite_master as text: one entry per object (type, name, table, SQL), in a stable order."""
    rows = db.execute("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name").fetchall()
    return "".join(
        f"-- {kind} {name} on {table}\n{normalised(sql) or '(made by SQLite)'};\n\n" for kind, name, table, sql in rows
    )


def test_the_schema_after_every_migration_is_the_checked_in_snapshot(tmp_path):
    now = schema_of(migrated(tmp_path / "q.db"))
    kept = SNAPSHOT.read_text(encoding="utf-8") if SNAPSHOT.exists() else ""
    if now != kept:
        diff = "".join(
            difflib.unified_diff(
                kept.splitlines(True), now.splitlines(True), "tests/schema.sql (checked in)", "after every migration"
            )
        )
        raise AssertionError(
            "the schema after every migration differs from tests/schema.sql. If a migration lost an index,"
            " a trigger or a view (a table rebuild drops them), make it again in the migration. If the"
            f" change is meant, regenerate the snapshot with `{REGENERATE}` and commit it with the"
            f" migration.\n{diff}"
        )


def test_a_rebuild_keeps_every_object_the_migrations_before_it_made(tmp_path):
    """Migration 012 rebuilt job, run and node_load: everything made by 001-011 is there again."""

    def names(db: sqlite3.Connection) -> set[tuple[str, str]]:
        return set(db.execute("SELECT type, name FROM sqlite_master"))

    assert names(migrated(tmp_path / "11.db", up_to=11)) - names(migrated(tmp_path / "all.db")) == set()


def test_the_routers_staleness_check_is_the_views_with_its_own_clock(tmp_path):
    """The router asks what the view stale_heads answers in the shell, with its clock for 'now'."""
    db = migrated(tmp_path / "q.db")
    [view] = db.execute("SELECT sql FROM sqlite_master WHERE name = 'stale_heads'").fetchone()
    assert " ".join(view.split()) == " ".join(
        f"CREATE VIEW stale_heads AS {STALE_SQL}".replace("julianday(:now)", "julianday('now')").split()
    )


if __name__ == "__main__":  # regenerate the snapshot, on purpose
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        SNAPSHOT.write_text(schema_of(migrated(Path(tmp) / "q.db")), encoding="utf-8")
    print(f"wrote {SNAPSHOT}; review `git diff {SNAPSHOT.name}` before committing it", file=sys.stderr)
