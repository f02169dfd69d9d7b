"""`gpuq storage`: the storage budget the router sees (GET /api/storage): the database's size, its
growth per day, the free space on its disk, the last backup, the last retention sweep, and which
tables and indexes hold the bytes."""

from __future__ import annotations

import json
from typing import Any

import click

from ..budget import Growth, duration_words, human_bytes
from .common import api_errors, router_of

# Counting a large SQLite file's pages (dbstat) reads all of it: the CLI waits for the answer.
STORAGE_TIMEOUT_S = 600.0


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the API's answer as JSON.")
@click.pass_context
@api_errors
def storage(ctx: click.Context, as_json: bool) -> None:
    """Where the database's bytes are: its size (file and WAL), growth per day, free space on its
    disk, the last backup, the last retention sweep (what it pruned, deleted and archived, its
    longest hold of the database's writer, or why it failed), and each table and index by size (SQLite's dbstat, or an estimate
    where it is not compiled in; PostgreSQL's pg_total_relation_size).

    Example: gpuq storage
    """
    router = router_of(ctx)
    router.timeout_s = STORAGE_TIMEOUT_S
    data = router.call("GET", "/api/storage")
    if as_json:
        click.echo(json.dumps(data))
        return
    for line in summary(data):
        click.echo(line)


def summary(data: dict[str, Any]) -> list[str]:
    lines = [size_line(data), growth_line(data)]
    free = data.get("free_bytes")
    if free is not None:
        days = data.get("days_until_full")
        lines.append(
            f"disk {data['disk']}: {human_bytes(free)} free"
            + (
                f"; full in about {days:g} days at the growth of the last {duration_words(data['growth_window_s'])}"
                if days is not None
                else ""
            )
        )
    else:
        lines.append("disk: the database server's (not seen from the router)")
    cap = data.get("max_database_bytes")
    if cap:
        used = data["database_bytes"] / cap
        lines.append(
            f"cap: router.max_database_bytes {human_bytes(cap)} ({used:.0%} used, by its pages; the WAL apart)"
        )
    lines.append(backup_line(data["backup"]))
    if data.get("retention"):
        lines.append(sweep_line(data["retention"]))
    lines += [f"warning: {w}" for w in data.get("warnings", [])]
    if data.get("empty_bytes") is not None:
        lines.append(empty_line(data))
    return lines + ["", *relation_lines(data)]


def size_line(data: dict[str, Any]) -> str:
    """SQLite: its pages (what the cap and the growth count), and the file and WAL on disk."""
    line = f"database {data['database']}: {human_bytes(data['database_bytes'])}"
    if data.get("disk") is not None:  # SQLite (PostgreSQL's disk is the server's)
        line += f" of pages (on disk: file {human_bytes(data['file_bytes'])}, WAL {human_bytes(data['wal_bytes'])})"
    return line


def growth_line(data: dict[str, Any]) -> str:
    growth = data.get("growth_bytes_per_day")
    if growth is None:
        return "growth: not known yet (the router's samples span less than an hour)"
    return (
        f"growth: {Growth(growth, data['growth_window_s']).words()} (samples of the last week, read oldest to newest)"
    )


def empty_line(data: dict[str, Any]) -> str:
    """The room unused inside the file, and what of it a compaction could give back."""
    return (
        f"unused inside the file: {human_bytes(data['empty_bytes'])} (room left in its pages, free pages;"
        f" each table and index keeps a page however empty); a compaction could give back at most"
        f" {human_bytes(data['reclaimable_bytes'] or 0)} ([retention] compact: at idle, once it is past the"
        " share set and 1 MiB)"
    )


def relation_lines(data: dict[str, Any]) -> list[str]:
    """Each table and index by size; those of one page (a new database's, mostly) folded into one line."""
    relations = data["relations"]
    single = [r for r in relations if r.get("pages") == 1]
    lines = [
        f"where the bytes are ({data['method']}):",
        f"  {'NAME':<32} {'KIND':<6} {'OF TABLE':<20} {'BYTES':>10} {'SHARE':>6}",
    ]
    for r in relations:
        if r.get("pages") != 1:
            lines.append(
                f"  {r['name']:<32} {r['kind']:<6} {r['table']:<20} {human_bytes(r['bytes']):>10} {r['share']:>6.1%}"
            )
    if single:
        each = human_bytes(single[0]["bytes"])
        lines.append(f"  and {len(single)} more tables and indexes of one page each ({each})")
    return lines


def backup_line(backup: dict[str, Any]) -> str:
    last = backup.get("last")
    text = (
        f"last backup: {last['at']} to {last['path']} ({human_bytes(last['bytes'])}"
        f"{', scheduled' if last['scheduled'] else ''})"
        if last
        else "last backup: none yet"
    )
    if backup.get("scheduled"):
        text += (
            f"; next at {backup['next_at']} (every {backup['every_s']:g}s, keeping {backup['keep']} in {backup['dir']})"
        )
    else:
        text += f"; scheduled backups: {backup.get('off')}"
    if backup.get("last_failure"):
        failed = backup["last_failure"]
        text += f"\nlast scheduled backup FAILED at {failed['at']}: {failed['error']}"
    return text


def sweep_line(sweep: dict[str, Any]) -> str:
    """The last retention sweep: when, what it did (or why it failed), and the next."""
    last = sweep.get("last")
    if last is None:
        text = "last retention sweep: none yet"
    else:
        did = last["swept"]
        text = (
            f"last retention sweep: {last['finished_at']} (by {last['by']}, {did['seconds']:g}s): "
            f"pruned {did['pruned']['jobs']} jobs, deleted {did['deleted']['jobs']},"
            f" archived {did['archived']['jobs']} ({human_bytes(did['archived']['bytes'])}),"
            f" {did['batches']} batches, longest hold of the writer {did['longest_hold_ms']:g} ms"
        )
    if sweep.get("next_at"):
        text += f"; next at {sweep['next_at']} (every {sweep['every_s']:g}s)"
    if last is not None and not last["ok"]:
        text += (
            f"\nlast retention sweep FAILED: {last['error']} (last success: {sweep['last_success_at'] or 'none yet'})"
        )
    return text
