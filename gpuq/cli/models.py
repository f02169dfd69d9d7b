"""`gpuq models`: every node's models (GET /api/models): installed, loaded now, named by the
config, last used, jobs in the last 30 days, measured speed."""

from __future__ import annotations

import json
from typing import Any

import click

from ..node_models import size_text
from ..speed import num_text
from .common import ago, api_errors, router_of

TAIL = f"{'SIZE':>8} {'FAMILY':10} {'PARAMS':>7} {'QUANT':8} {'LOADED':6} {'JOBS30D':>7} {'LAST USED':>10}  PROMPT/S OUTPUT/S   LOAD"


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the API's answer as JSON.")
@click.pass_context
@api_errors
def models(ctx: click.Context, as_json: bool) -> None:
    """Every node's models: installed (/api/tags), loaded now (/api/ps), the one the config names
    for the node (*), when last used, jobs in the last 30 days, and the speed measured over its
    last 20 done runs (prompt and output tokens per second, load time).

    Example: gpuq models
    """
    data = router_of(ctx).call("GET", "/api/models")
    if as_json:
        click.echo(json.dumps(data))
        return
    names = {id(m): model_name(m) for node in data["nodes"] for m in node["models"]}
    width = max([len("MODEL"), *map(len, names.values())])
    click.echo(f"{'NODE':12} {'MODEL':{width}} {TAIL}")
    for node in data["nodes"]:
        for m in node["models"]:
            click.echo(f"{node['name']:12} {names[id(m)]:{width}} {model_line(m)}")
        if node["ps_error"]:
            click.echo(f"{'':12} loaded now unknown: {node['ps_error']}")


def model_name(m: dict[str, Any]) -> str:
    """ "* qwen3:8b": the config names it for the node; "(not installed)": /api/tags lacks it."""
    name = ("* " if m["configured"] else "  ") + str(m["name"])
    return name + ("" if m["installed"] else " (not installed)")


def model_line(m: dict[str, Any]) -> str:
    """The columns after the model's name."""
    loaded = {True: "yes", False: "no", None: "?"}[m["loaded"]]
    used = f"{ago(m['last_used'])} ago" if m["last_used"] else "never"
    s = m["speed"]
    return (
        f"{size_text(m['size']):>8} {m['family'] or '-':10} {m['parameter_size'] or '-':>7} "
        f"{m['quantization'] or '-':8} {loaded:6} {m['jobs_30d']:>7} {used:>10}  "
        f"{_num(s['prompt_tokens_per_s']):>8} {_num(s['output_tokens_per_s']):>8} {_num(s['load_s'], 's'):>6}"
    )


def _num(value: float | None, unit: str = "") -> str:
    return "-" if value is None else num_text(value) + unit
