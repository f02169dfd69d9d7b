"""A multi-user lab's CLI (issue 43, item 8): gpuq.toml's [[user]]s keep their tokens in
environment variables (token_env), and each person's shell holds their own only. The real daemon
runs with every variable set, on a port of its own (never 8750); the real CLI runs from the
config's directory with one user's variable, or none: it finds the router, sends that user's
token, needs no one else's, and names a config it cannot read as such."""

from __future__ import annotations

import json
import os
import sys
import tomllib
from pathlib import Path

import tomli_w
from conftest import node_table, run_cli

from gpuq.upkeep import archive

MODEL = "qwen3-coder:30b"
TOKENS = {"GPUQ_ALICE_TOKEN": "alice-secret-0123", "GPUQ_BOB_TOKEN": "bob-secret-4567"}
USERS = [
    {"name": "alice", "token_env": "GPUQ_ALICE_TOKEN", "role": "admin"},
    {"name": "bob", "token_env": "GPUQ_BOB_TOKEN", "role": "member"},
]
# Nothing of the test machine's may steer the CLI: only what each test gives it.
STEERING = ("GPUQ_ROUTER", "GPUQ_CONFIG", "GPUQ_DATABASE", "GPUQ_TOKEN", *TOKENS)


def shell(**given: str) -> dict[str, str]:
    """A user's shell: none of the lab's variables but those given."""
    return {**{k: v for k, v in os.environ.items() if k not in STEERING}, **given}


async def gpuq(cwd: Path, *args: str, env: dict[str, str]):
    """The real CLI with exactly `env` as its environment (run_cli would add the test's own)."""
    pairs = [f"{k}={v}" for k, v in env.items()]
    return await run_cli(*args, cwd=cwd, command=("env", "-i", *pairs, sys.executable, "-m", "gpuq.cli"))


def with_users(config: Path) -> None:
    data = tomllib.loads(config.read_text())
    data["user"] = USERS
    config.write_text(tomli_w.dumps(data))


async def lab(fakes, daemon_factory):
    fake = await fakes(MODEL, tokens=4)
    d = await daemon_factory([node_table("node-1", fake, 1, ["task"], MODEL)], start=False, env=dict(TOKENS))
    with_users(d.config)
    d.auth = {"Authorization": f"Bearer {TOKENS['GPUQ_ALICE_TOKEN']}"}
    await d.start()
    assert not d.url.endswith(":8750")
    return d


async def test_a_members_shell_with_only_their_own_token_reaches_the_router(fakes, daemon_factory):
    d = await lab(fakes, daemon_factory)
    here = d.config.parent
    bob = shell(GPUQ_BOB_TOKEN=TOKENS["GPUQ_BOB_TOKEN"])
    res = await gpuq(here, "queue", env=bob)
    assert res.code == 0, res
    assert "cannot reach" not in res.err and d.url in res.err, res
    res = await gpuq(here, "task", "hello from bob", "--wait", "--json", env=bob)
    assert res.code == 0, res
    job_id = json.loads(res.out)["id"]
    assert (await d.job(job_id))["owner"] == "bob"  # his own token, from his own variable
    res = await gpuq(here, "show", job_id, env=bob)
    assert res.code == 0 and "owner: bob" in res.out, res
    # reload is an admin's: bob reaches the router, which refuses him by name.
    res = await gpuq(here, "reload", env=bob)
    assert res.code == 1 and "error 403 reloading gpuq.toml is for an admin; bob is a member" in res.err, res
    alice = shell(GPUQ_ALICE_TOKEN=TOKENS["GPUQ_ALICE_TOKEN"])
    res = await gpuq(here, "reload", env=alice)
    assert res.code == 0 and res.out.startswith(f"reloaded {d.config}: nothing changed"), res
    # $GPUQ_TOKEN is the token given: it wins over a token_env set beside it.
    res = await gpuq(here, "task", "given", "--json", env={**alice, "GPUQ_TOKEN": TOKENS["GPUQ_BOB_TOKEN"]})
    assert res.code == 0 and json.loads(res.out)["owner"] == "bob", res
    # Both variables set (the router's own shell): whose shell it is is not guessed; no token.
    res = await gpuq(here, "task", "whose", env={**alice, **bob})
    assert res.code == 1 and "error 401 " in res.err, res


async def test_a_config_that_cannot_be_read_is_named_never_an_unreachable_router(tmp_path):
    (tmp_path / "gpuq.toml").write_text('[router]\nlisten = "127.0.0.1:8750"\n[[node]\nname = "x"\n')
    for args in (("queue",), ("show", "1760883402-9f3a7c21"), ("nodes",)):
        res = await gpuq(tmp_path, *args, env=shell())
        assert res.code == 1 and res.out == "", res
        first = res.err.splitlines()[0]
        assert first.startswith("error - the config gpuq.toml could not be read: not valid TOML: "), res.err
        assert "cannot reach" not in res.err and "8750" not in res.err, res.err
    # A router given: asked all the same (it reads its own file), and said that no token came from this one.
    res = await gpuq(tmp_path, "--router", "http://127.0.0.1:1", "queue", env=shell())
    assert res.code == 1, res
    assert res.err.splitlines()[0].startswith("gpuq: the config gpuq.toml could not be read: not valid TOML: ")
    assert res.err.splitlines()[0].endswith("; no token taken from it"), res.err
    assert "error - cannot reach the router at http://127.0.0.1:1" in res.err, res.err
    # A mistake in a value names the key, as `gpuq serve` would.
    (tmp_path / "gpuq.toml").write_text('[router]\nstale_after = "ten minutes"\n')
    res = await gpuq(tmp_path, "queue", env=shell())
    assert res.code == 1, res
    assert res.err.splitlines()[0].startswith("error - the config gpuq.toml could not be read: router.stale_after")


async def test_commands_that_need_no_router_need_no_token(tmp_path):
    """archive search and restore read the config's paths only: no one's token_env is read."""
    data = {
        "router": {"database": "gpuq.db"},
        "node": [{"name": "n", "url": "http://127.0.0.1:1", "rank": 1, "roles": ["task"], "model": MODEL}],
        "user": USERS,
    }
    (tmp_path / "gpuq.toml").write_text(tomli_w.dumps(data))
    job = {
        "id": "1764547200-0a1b2c3d",
        "kind": "task",
        "state": "done",
        "node": "n",
        "created_at": "2025-12-01T00:00:00.000000Z",
        "prompt": "the export job's retry budget",
        "runs": [],
    }
    archive.append(tmp_path / "gpuq-archive", [job], "delete", 1764547300.0)
    res = await gpuq(tmp_path, "archive", "search", "retry budget", env=shell())
    assert res.code == 0, res
    assert res.out.startswith("1764547200-0a1b2c3d  task  done  on n"), res
    res = await gpuq(tmp_path, "restore", str(tmp_path / "no-such-backup.db"), env=shell())
    assert res.code == 1 and "no-such-backup.db does not exist; nothing was replaced" in res.err, res
