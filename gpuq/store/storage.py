"""How much room the database takes, per engine: a SQLite file's bytes (with its WAL) and the
free space on its disk, and which tables and indexes hold the bytes (SQLite's `dbstat` virtual
table when it is compiled in, else an estimate from the stored values' lengths; PostgreSQL's
`pg_total_relation_size`). The router's samples and backup records are verbs of records.py."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from typing import Any

from .steps import Row

# SQLite: the database's pages as of the last commit (the WAL's included), free ones too: what
# max_page_count (router.max_database_bytes) counts.
SQLITE_PAGES_SQL = "SELECT page_count, page_size FROM pragma_page_count(), pragma_page_size()"
# PostgreSQL: the database's size, and each table of gpuq's schema with its indexes apart.
PG_DATABASE_BYTES_SQL = "SELECT pg_database_size(current_database()) AS bytes"
PG_RELATIONS_SQL = """SELECT c.relname AS name, CASE c.relkind WHEN 'i' THEN 'index' ELSE 'table' END AS kind,
    COALESCE(t.relname, c.relname) AS tbl, pg_relation_size(c.oid) AS bytes,
    pg_total_relation_size(c.oid) AS total_bytes
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_index x ON x.indexrelid = c.oid LEFT JOIN pg_class t ON t.oid = x.indrelid
WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'i')"""


def file_bytes(path: Path) -> tuple[int, int]:
    """The SQLite file's bytes and its WAL's (0 when there is none)."""

    def size(p: Path) -> int:
        try:
            return p.stat().st_size
        except FileNotFoundError:
            return 0

    return size(path), size(path.with_name(path.name + "-wal"))


def disk_free(path: Path) -> int | None:
    """Free bytes on the disk holding `path` (for an unprivileged process: what it may use)."""
    try:
        return shutil.disk_usage(path.parent).free
    except OSError:
        return None


def sqlite_relations(
    path: Path, busy_timeout_s: float, dbstat: bool = True
) -> tuple[str, list[Row], int | None, int | None]:
    """Each table and index of the SQLite file with its bytes (and, by dbstat, its pages), largest
    first; how they were counted: "dbstat" (the pages each holds, exactly) or "estimate" (dbstat
    not compiled in: the stored values' lengths, tables only); the bytes the file holds empty
    (dbstat only, else None): unused inside its pages and its free pages; and of those, what a
    compaction could give back at most (`reclaimable`): the free pages, and each table's and
    index's whole pages of unused space past its first page (each keeps one page however empty:
    a new database's 60 tables and indexes are 60 pages, mostly empty, and nothing to reclaim).
    Blocking: a connection of its own, read-only, in a thread; a reader, so the router's writer
    goes on meanwhile. `dbstat=False`: the estimate (what a build without dbstat gives)."""
    db = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, isolation_level=None)
    try:
        db.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        objects = {
            name: (kind, tbl)
            for kind, name, tbl in db.execute(
                "SELECT type, name, tbl_name FROM sqlite_master WHERE type IN ('table', 'index')"
            )
        }
        counted: dict[str, int] = {}
        unused: dict[str, int] = {}
        pages: dict[str, int] = {}
        empty = reclaimable = None
        method = "estimate"
        if dbstat:
            try:
                for name, size, free, n in db.execute(
                    "SELECT name, SUM(pgsize), SUM(unused), COUNT(*) FROM dbstat GROUP BY name"
                ):
                    counted[name], unused[name], pages[name] = size, int(free or 0), int(n)
                method = "dbstat"
            except sqlite3.OperationalError:  # no such table: dbstat (SQLITE_ENABLE_DBSTAT_VTAB unset)
                pass
        if method == "estimate":
            counted = {name: _estimate(db, name) for name, (kind, _) in objects.items() if kind == "table"}
        else:
            page_size = int(db.execute("PRAGMA page_size").fetchone()[0])
            free_pages = int(db.execute("PRAGMA freelist_count").fetchone()[0])
            empty = sum(unused.values()) + free_pages * page_size
            whole = sum(min(unused[name] // page_size, pages[name] - 1) for name in unused)
            reclaimable = (free_pages + whole) * page_size
    finally:
        db.close()
    found: list[Row] = []
    for name, size in counted.items():
        kind, tbl = objects.get(name, ("table", name))  # sqlite_schema itself is no row of sqlite_master
        row: Row = {"name": name, "kind": kind, "table": tbl, "bytes": int(size or 0)}
        if method == "dbstat":
            row["empty_bytes"], row["pages"] = unused[name], pages[name]
        found.append(row)
    return method, sorted(found, key=lambda r: (-r["bytes"], r["name"])), empty, reclaimable


def _estimate(db: sqlite3.Connection, table: str) -> int:
    columns = [r[1] for r in db.execute("SELECT * FROM pragma_table_info(?)", (table,))]
    if not columns:
        return 0
    lengths = " + ".join(f'COALESCE(LENGTH(CAST("{c}" AS BLOB)), 0)' for c in columns)
    return int(db.execute(f'SELECT COALESCE(SUM({lengths}), 0) FROM "{table}"').fetchone()[0])


def pg_relations(rows: list[Row]) -> list[Row]:
    """PG_RELATIONS_SQL's rows as sqlite_relations gives them: a table's bytes are its heap and
    TOAST (its total less its indexes), each index apart, largest first."""
    index_bytes: dict[str, int] = {}
    for r in rows:
        if r["kind"] == "index":
            index_bytes[r["tbl"]] = index_bytes.get(r["tbl"], 0) + int(r["bytes"])
    found: list[dict[str, Any]] = []
    for r in rows:
        size = int(r["bytes"]) if r["kind"] == "index" else int(r["total_bytes"]) - index_bytes.get(r["name"], 0)
        found.append({"name": r["name"], "kind": r["kind"], "table": r["tbl"], "bytes": size})
    return sorted(found, key=lambda r: (-r["bytes"], r["name"]))
