"""Retention: `prune` asks the running router to sweep now, or with --dry-run what it would drop
(POST /api/prune); `archive search` reads the archive's files locally (gpuq/upkeep/archive.py)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from .common import api_errors, fail, router_of
from .where import read_config

# A first sweep of a large database takes as long as it takes: the CLI waits for the answer.
PRUNE_TIMEOUT_S = 3600.0


def _mb(n: int) -> str:
    """Bytes as a person reads them: 812 bytes, 42.1 kB, 3.2 MB."""
    if n < 10_000:
        return f"{n} bytes"
    return f"{n / 1e3:.1f} kB" if n < 1_000_000 else f"{n / 1e6:.1f} MB"


@click.command()
@click.option("--dry-run", is_flag=True, help="Say what a sweep now would drop, and how many bytes; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the API's answer as JSON.")
@click.pass_context
@api_errors
def prune(ctx: click.Context, dry_run: bool, as_json: bool) -> None:
    """Run the retention sweep now ([retention] in gpuq.toml): ended jobs past prune_after lose
    their request, output and reasoning, and those past delete_after their rows, each archived
    first. Waiting, running and held jobs are never touched. Admin only.

    Example: gpuq prune --dry-run
    """
    router = router_of(ctx)
    router.timeout_s = PRUNE_TIMEOUT_S
    data = router.call("POST", "/api/prune", {"dry_run": dry_run})
    if as_json:
        click.echo(json.dumps(data))
        return
    if dry_run:
        d, p = data["delete"], data["prune"]
        click.echo(
            f"would delete {d['jobs']} job(s) with {d['runs']} run(s) and {d['events']} event(s)"
            f" ({_mb(d['bytes'])}: their rows' stored values, every column)"
        )
        click.echo(
            f"would prune the output and request of {p['jobs']} job(s)"
            f" ({_mb(p['bytes'])}: the request, output, reasoning and prompt past its start)"
        )
        sw = data.get("sweeps")
        if sw and (sw["prune"]["batches"] or sw["delete"]["batches"]):
            click.echo(
                f"batches: would prune the files of {sw['prune']['batches']} ({sw['prune']['files']} file(s),"
                f" {_mb(sw['prune']['bytes'])}), delete {sw['delete']['batches']} with {sw['delete']['lines']} line(s)"
            )
        click.echo(f"archived first to {data['archive']}" if data["archive"] else "not archived (archive = off)")
        return
    if data["skipped"]:
        click.echo(f"nothing done: {data['skipped']}")
        return
    d, p, a = data["deleted"], data["pruned"], data["archived"]
    click.echo(f"deleted {d['jobs']} job(s) with {d['runs']} run(s) and {d['events']} event(s)")
    click.echo(f"pruned the output and request of {p['jobs']} job(s)")
    s = data.get("sweeps") or {}
    if s.get("pruned") or s.get("deleted"):  # ended sweeps (gpuq batch, the Batch APIs)
        click.echo(
            f"batches: pruned the files and replies of {s['pruned']}, deleted {s['deleted']} with {s['lines']}"
            f" line(s); {s['files']} file(s) and {s['archived']} archive line(s)"
        )
    click.echo(f"archived {a['jobs']} job line(s), {_mb(a['bytes'])} compressed; {data['pages_freed']} page(s) freed")
    click.echo(
        f"{data['batches']} batch(es), the longest held the database's writer {data['longest_hold_ms']:.1f} ms;"
        f" {data['seconds']:.2f} s in all"
    )


@click.group()
def archive() -> None:
    """The retention archive: jobs that left the database, one gzip JSON Lines file a month.

    Example: gpuq archive search "export job"
    """


@archive.command("search")
@click.argument("text")
@click.option("--dir", "directory", type=click.Path(file_okay=False), help="The archive (default: the config's).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="The router's gpuq.toml.")
@click.option("--limit", type=click.IntRange(1, 100_000), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print each job whole, one JSON object a line.")
@click.pass_context
def search(
    ctx: click.Context, text: str, directory: str | None, config_path: str | None, limit: int, as_json: bool
) -> None:
    """Find archived jobs by id or by text in their prompt, output or request (ignoring case),
    newest first, each once. Reads the archive's files on this machine; no router needed. A
    damaged file is read past its damage, which is named (file, offset, bytes) on stderr.

    Example: gpuq archive search 1760883402-9f3a7c21
    """
    from ..upkeep.archive import find

    where = Path(directory) if directory else _configured_archive(ctx, config_path)
    if not where.is_dir():
        fail("-", f"no archive at {where} (nothing archived yet, or another --dir)")
    result = find(where, text, limit)
    for damage in result.damaged:
        click.echo(f"warning: damaged archive: {damage.text()}; every whole member around it was read", err=True)
    found = result.jobs
    for job in found:
        if as_json:
            click.echo(json.dumps(job))
            continue
        first = (job.get("prompt") or "").splitlines()[0][:80] if job.get("prompt") else ""
        click.echo(f"{job['id']}  {job['kind']}  {job['state']}  on {job['node']}  {job['created_at'][:19]}  {first}")
    if not as_json:
        click.echo(f"{len(found)} job(s) found in {where}", err=True)


def _configured_archive(ctx: click.Context, config_path: str | None) -> Path:
    """[retention] archive of the config: read without a router and without anyone's token."""
    config = read_config(config_path or ctx.obj["config"])
    if config.path is None:
        fail("-", "no gpuq.toml found: name the archive with --dir, or the config with --config")
    if config.problem is not None:
        fail("-", config.problem)
    settings, path = config.settings, config.path
    assert settings is not None  # read, since no problem
    if settings.retention_archive is None:
        fail("-", f"{path}: [retention] archive is off; name a directory with --dir")
    return settings.retention_archive
