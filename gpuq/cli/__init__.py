"""`gpuq`: the command line. Commands parse, call the router over HTTP, and print; errors
print `error <status> <message>` then `not retried`, and exit non-zero.

This is the group and its global options; the commands live by group, each module registered
below: jobs (task, critique, wait, show), queue (queue, stale, move, preempt, delete, clear,
retry), history, usage, lab (serve, init, reload, nodes, health), models, backup (backup, restore), retention (prune,
archive search), storage and service.
What they share is in common; the HTTP client in client."""

from __future__ import annotations

import click

from . import backup, batch, history, jobs, lab, models, queue, retention, service, storage, usage


@click.group()
@click.version_option(package_name="gpuq", prog_name="gpuq", message="%(prog)s %(version)s")
@click.option(
    "--router",
    help="Router URL (else $GPUQ_ROUTER, else the router running on this database, else the config's public_url).",
)
@click.option("--config", type=click.Path(dir_okay=False), help="gpuq.toml (else $GPUQ_CONFIG, else ./gpuq.toml).")
@click.pass_context
def main(ctx: click.Context, router: str | None, config: str | None) -> None:
    """gpuq: send AI jobs to your own GPU machines, one job per node, durably queued.

    Example: gpuq task "add a retry budget to the export job"
    """
    ctx.obj = {"router": router, "config": config}


for command in (
    jobs.task,
    jobs.critique,
    jobs.wait,
    jobs.show,
    queue.queue_cmd,
    queue.stale,
    queue.move,
    queue.preempt,
    queue.delete,
    queue.clear,
    queue.retry,
    history.history,
    usage.usage,
    lab.serve,
    lab.init,
    lab.reload,
    lab.nodes,
    lab.health,
    models.models,
    backup.backup,
    backup.restore,
    retention.prune,
    retention.archive,
    storage.storage,
    service.service,
    batch.batch,
):
    main.add_command(command)
