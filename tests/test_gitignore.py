"""A router run in a clone leaves nothing of its own for git to show (issue 43, item 8): its
database and lock, the retention archive and the scheduled backups beside it (everyone's
prompts), a restore's replaced database, the demo's queue. The real router, with the paths it
chooses itself, in a fresh git repository holding the project's .gitignore and nothing else."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import tomli_w
from conftest import ROOT, eventually, free_port, node_table, run_cli

MODEL = "qwen3-coder:30b"
GIT = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, env={**os.environ, **GIT})
    assert done.returncode == 0, done.stderr
    return done.stdout


class Router:
    """`gpuq serve ARGS` in the repository, its log kept outside it."""

    def __init__(self, repo: Path, log: Path, *args: str):
        self.repo, self.log, self.args = repo, log, args
        self.proc: asyncio.subprocess.Process | None = None

    async def __aenter__(self) -> Router:
        with open(self.log, "ab") as out:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "gpuq.cli", "serve", *self.args, cwd=self.repo, stdout=out, stderr=out
            )
        await eventually(self.listening, 30, 0.05, "the router to listen")
        return self

    def listening(self) -> bool:
        assert self.proc is not None
        if self.proc.returncode is not None:
            raise AssertionError(f"gpuq serve exited {self.proc.returncode}:\n{self.log.read_text()}")
        return "gpuq router listening on " in self.log.read_text(errors="replace")

    async def __aexit__(self, *exc: object) -> None:
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(self.proc.wait(), 20)


async def test_a_router_run_in_a_clone_leaves_nothing_for_git_to_show(fakes, tmp_path):
    repo = tmp_path / "clone"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / ".gitignore").write_bytes((ROOT / ".gitignore").read_bytes())
    git(repo, "add", ".gitignore")
    git(repo, "commit", "-qm", "the project's .gitignore")
    # `make run` in a clone without a gpuq.toml: the demo, its queue in ./gpuq-demo.db.
    async with Router(repo, tmp_path / "demo.log", "--demo", "--listen", f"127.0.0.1:{free_port()}"):
        pass
    fake = await fakes(MODEL, tokens=4, thinking_tokens=0)
    port = free_port()
    config = {
        "router": {"listen": f"127.0.0.1:{port}", "health_interval": "0.2s", "shutdown_grace": "1s"},
        "node": [node_table("node-1", fake, 1, ["task"], MODEL)],
        # Due at once: the archive and the backups are made where the router puts them by default.
        "retention": {"prune_after": "1s", "delete_after": "2s", "every": "1s"},
        "backup": {"every": "1s"},
    }
    (repo / "gpuq.toml").write_text(tomli_w.dumps(config))
    url = f"http://127.0.0.1:{port}"
    async with Router(repo, tmp_path / "router.log", "--config", "gpuq.toml"):
        res = await run_cli("--router", url, "task", "the lab's private prompt", "--wait", "--json")
        assert res.code == 0, res
        job_id = json.loads(res.out)["id"]

        async def deleted() -> bool:
            shown = await run_cli("--router", url, "show", job_id)
            return shown.code == 1 and "retention deleted it" in shown.err

        await eventually(deleted, 30, 0.2, "retention to delete the job")
        await eventually(lambda: list((repo / "gpuq-backups").glob("*.db")), 30, 0.1, "a scheduled backup")
    backup = sorted((repo / "gpuq-backups").glob("*.db"))[-1]
    res = await run_cli("restore", str(backup), "--config", str(repo / "gpuq.toml"), cwd=repo)
    assert res.code == 0, res
    made = {p.name for p in repo.iterdir()}
    assert {"gpuq.db", "gpuq-archive", "gpuq-backups", "gpuq-demo.db"} <= made, made
    assert any(name.startswith("gpuq.db.replaced-") for name in made), made
    assert list((repo / "gpuq-archive").glob("jobs-*.jsonl.gz"))
    assert git(repo, "status", "--porcelain", "--untracked-files=all", "--ignored=no") == ""
