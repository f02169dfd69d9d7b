"""Keep the router's machine awake while its GPUs work: a laptop that sleeps breaks every running
job's stream (and the node's Ollama cancels the generation). While any job runs, a sleep
inhibitor is held the platform's own way, as a child process that holds it until terminated:
macOS `caffeinate -i -w <router pid>`, Linux `systemd-inhibit --what=idle:sleep` around a wait
for the router's pid (both let go by themselves if the router dies). It starts when the first job
starts running and is terminated once the lab is idle (after RELEASE_AFTER_S, so back-to-back
jobs hold one inhibitor). An inhibitor that cannot be held (a missing tool; systemd-inhibit on a
machine without systemd exits at once) is logged once, and /health keeps saying it: a warning
while jobs run (the machine may sleep during them), a quiet note while the lab is idle (there is
nothing to keep awake then); no job ever fails for it. `[router] keep_awake = false` turns it off."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Any

from ..jobs import iso

log = logging.getLogger("gpuq")

RELEASE_AFTER_S = 1.0  # idle this long before letting go: a job's finish that starts the next is no gap


def inhibitor_command(running: int, pid: int | None = None) -> list[str]:
    """The platform's inhibitor, held until the process is terminated (or the router exits)."""
    pid = os.getpid() if pid is None else pid
    if sys.platform == "darwin":
        return ["caffeinate", "-i", "-w", str(pid)]
    return [
        "systemd-inhibit",
        "--what=idle:sleep",
        "--who=gpuq",
        f"--why={running} job(s) running",
        "--mode=block",
        "tail",
        f"--pid={pid}",
        "-f",
        "/dev/null",
    ]


class Awake:
    def __init__(self, enabled: bool = True, release_after_s: float = RELEASE_AFTER_S):
        self.enabled = enabled
        self.release_after_s = release_after_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.by: str | None = None
        self.since: float | None = None
        self.error: str | None = None  # why none is held while jobs run (the tool is missing, it exited)
        # The last such failure, kept while idle (a quiet note on /health) until one is held again.
        self.unavailable: str | None = None
        self.running = 0  # jobs running, as the last update said
        self._warned = False
        self._release: asyncio.TimerHandle | None = None

    def update(self, running: int) -> None:
        """The number of jobs running now: hold the inhibitor while it is above 0."""
        if not self.enabled:
            return
        self.running = running
        if running > 0:
            if self._release is not None:
                self._release.cancel()
                self._release = None
            self._check()
            if self.proc is None and self.error is None:
                self._hold(running)
        elif self.proc is not None or self.error is not None:
            if self._release is None:
                try:
                    loop = asyncio.get_running_loop()
                except RuntimeError:
                    self.release()
                    return
                self._release = loop.call_later(self.release_after_s, self.release)

    def _warn(self, message: str) -> None:
        self.error = self.unavailable = message
        if not self._warned:  # once per router: the lab works on, it may just sleep
            self._warned = True
            log.warning("keep awake: %s; jobs run on, but the machine may sleep during them", message)

    def _hold(self, running: int) -> None:
        command = inhibitor_command(running)
        if shutil.which(command[0]) is None:
            self._warn(f"{command[0]} not found on PATH")
            return
        try:
            self.proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            self._warn(f"{command[0]} could not start: {exc}")
            return
        self.by, self.since = command[0], time.time()
        self.unavailable = None
        log.info("keep awake: %s holds the machine awake while %d job(s) run (pid %d)", self.by, running, self.proc.pid)

    def _check(self) -> None:
        """An inhibitor that exited by itself (refused, killed) holds nothing."""
        if self.proc is not None and self.proc.poll() is not None:
            code, by = self.proc.returncode, self.by
            self.proc, self.by, self.since = None, None, None
            self._warn(f"{by} exited with code {code}")

    def release(self) -> None:
        """The lab is idle (or the router stops): end the inhibitor and its children."""
        if self._release is not None:
            self._release.cancel()
            self._release = None
        self.error = None  # the next busy spell tries again
        proc, self.proc, self.by, self.since = self.proc, None, None, None
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(2)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
        log.info("keep awake: released (no job runs)")

    def json(self) -> dict[str, Any] | None:
        """/health's "awake": held (by what, since when); or not held, why (`error`) and whether
        jobs run meanwhile (`running`: the page warns only then); null when nothing was ever
        refused and nothing runs (or keep_awake is off)."""
        self._check()
        if self.proc is not None and self.since is not None:  # (set together)
            return {"held": True, "by": self.by, "since": iso(self.since), "pid": self.proc.pid}
        why = self.error or self.unavailable
        if why is not None:
            return {"held": False, "by": None, "since": None, "error": why, "running": self.running > 0}
        return None
