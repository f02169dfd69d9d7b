"""Backup and restore of the router's SQLite database: `backup` asks the running router for a
consistent, checked copy (POST /api/backup); `restore` is local, on the router's machine, with the
router stopped (gpuq/ops/restore.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ..config import ConfigError
from ..errors import GpuqError
from .common import api_errors, fail, router_of
from .where import read_config

# A large database takes as long as it takes to copy and check: the CLI waits for the answer.
BACKUP_TIMEOUT_S = 3600.0


@click.command()
@click.argument("path")
@click.option("--force", is_flag=True, help="Replace PATH if it exists.")
@click.option("--json", "as_json", is_flag=True, help="Print the API's answer as JSON.")
@click.pass_context
@api_errors
def backup(ctx: click.Context, path: str, force: bool, as_json: bool) -> None:
    """Back the router's database up to PATH while it runs: a consistent copy (SQLite's VACUUM
    INTO, never a file copy), checked with PRAGMA integrity_check, then renamed into place.

    PATH is a file on the router's machine, absolute (the router does not guess what a relative
    path is relative to); an existing file is replaced only with --force. Admin only. On
    PostgreSQL, use pg_dump (the error names the command).

    Example: gpuq backup /var/backups/gpuq-$(date +%F).db
    """
    router = router_of(ctx)
    router.timeout_s = BACKUP_TIMEOUT_S
    data = router.call("POST", "/api/backup", {"path": path, "force": force})
    if as_json:
        click.echo(json.dumps(data))
        return
    click.echo(
        f"backed up to {data['path']} ({data['bytes'] / 1e6:.1f} MB in {data['seconds']:.1f} s, "
        f"integrity {data['integrity']})"
    )


@click.command()
@click.argument("backup_path", metavar="BACKUP", type=click.Path(dir_okay=False))
@click.option(
    "--database",
    type=click.Path(dir_okay=False),
    help="The SQLite file to replace (also $GPUQ_DATABASE); else the config's, as `gpuq serve` chooses it.",
)
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="The router's gpuq.toml.")
@click.pass_context
def restore(ctx: click.Context, backup_path: str, database: str | None, config_path: str | None) -> None:
    """Put BACKUP in the place of the router's database, with the router stopped (refused while
    one runs on it). BACKUP is checked first (it opens as SQLite, its integrity check is ok, it
    has gpuq's schema and no newer one); the replaced database is kept aside as
    DB.replaced-<UTC time>. Prints what the restored queue holds; its running jobs fail when the
    router starts, as after a crash.

    Example: gpuq restore /var/backups/gpuq-2026-12-01.db --config ~/gpuq.toml
    """
    from ..ops.daemon import database_override
    from ..ops.restore import restore as restore_database
    from ..ops.restore import summary

    try:
        chosen = database_override(database)
    except ConfigError as exc:
        click.echo(f"gpuq: config error: {exc.message}", err=True)
        sys.exit(2)
    if chosen is None:  # the config's database: no one's token needed to know it
        config = read_config(config_path or ctx.obj["config"])
        if config.problem is not None:
            fail("-", config.problem)
        chosen = config.settings.database if config.settings is not None else None
    if chosen is None:
        fail(
            "-",
            "no database to restore into: give --database DB, set $GPUQ_DATABASE, or point --config "
            "(else $GPUQ_CONFIG, else ./gpuq.toml) at the router's gpuq.toml",
        )
    if isinstance(chosen, str):  # a postgresql:// DSN
        fail(
            409,
            "the database is on PostgreSQL, and gpuq does not reinvent pg_restore: restore a pg_dump "
            "with `pg_restore --clean --dbname=...`; see docs/operations.md, Backup and restore",
        )
    try:
        restored = restore_database(Path(backup_path), chosen)
    except GpuqError as exc:
        fail(exc.status, exc.message)
    except OSError as exc:
        fail("-", f"not restored: {exc}")
    click.echo(summary(restored))
