"""A throwaway PostgreSQL cluster for the tests and the bench (bench/postgres.py).

`Cluster().start()` runs Debian's server binaries (/usr/lib/postgresql/<version>/bin, the newest;
or $GPUQ_PG_BINDIR): `initdb` into a new temp dir, then `pg_ctl start` with
`listen_addresses = ''` (no TCP at all) and its Unix socket in that same dir. PostgreSQL refuses
to run as root, so as root (CI) every server command runs as the `postgres` system user
(`runuser -u postgres -- ...`) and the temp dir is handed to that user; otherwise as the
current user. Clients always connect as the database superuser `postgres`, trusted on the
socket. `stop()` stops the server and removes the dir.

Nothing is left running if the process that started the cluster dies without stopping it
(SIGKILL, a pytest-timeout that exits): a watchdog process holds the read end of a pipe whose
write end only the starter holds, and at EOF stops the server (`-m immediate`) and removes the
dir. Anything that goes wrong raises NoPostgres with the reason and the server's log: a test
that needs PostgreSQL fails, never skips."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from urllib.parse import quote

SUPERUSER = "postgres"  # initdb -U: the role every client connects as (trust on the socket)
PORT = 5432  # only names the socket file (.s.PGSQL.5432): the dir is ours alone
INSTALL_HINT = "`make postgres` installs Debian's postgresql (apt-get install postgresql)"

# Runs in its own session so a Ctrl-C at the terminal does not reach it; see the docstring.
WATCHDOG = """
import os, shutil, signal, subprocess, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
sys.stdin.buffer.read()
pg_ctl, data, top, *prefix = sys.argv[1:]
if os.path.exists(os.path.join(data, "postmaster.pid")):
    subprocess.run([*prefix, pg_ctl, "stop", "-D", data, "-m", "immediate", "-w", "-t", "60"],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
shutil.rmtree(top, ignore_errors=True)
"""


class NoPostgres(Exception):
    """PostgreSQL could not be found or started; the message says why."""


def find_bindir() -> Path:
    """Where initdb and pg_ctl are: $GPUQ_PG_BINDIR, else Debian's newest
    /usr/lib/postgresql/<version>/bin, else the PATH."""
    told = os.environ.get("GPUQ_PG_BINDIR")
    if told:
        if not (Path(told) / "initdb").exists():
            raise NoPostgres(f"GPUQ_PG_BINDIR={told} holds no initdb")
        return Path(told)
    found = [p.parent for p in Path("/usr/lib/postgresql").glob("*/bin/initdb")]
    if found:
        return max(found, key=lambda p: int(re.sub(r"\D", "", p.parent.name) or 0))
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).resolve().parent
    raise NoPostgres(f"PostgreSQL's server programs (initdb, pg_ctl) are not installed: {INSTALL_HINT}")


class Cluster:
    """One throwaway cluster. `durable=False` (the tests) turns fsync off: what the tests check
    is what PostgreSQL answers, not what survives a power cut; the bench keeps it on."""

    def __init__(self, durable: bool = False, settings: dict[str, str] | None = None):
        self.durable = durable
        self.settings = settings or {}
        self.dir: Path | None = None
        self.bindir: Path | None = None
        self.prefix: list[str] = []  # runuser -u postgres -- when root
        self.owner_uid = os.getuid()
        self._watchdog: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._count = 0

    # -- where and as whom -------------------------------------------------------------------

    @property
    def data(self) -> Path:
        return self.dir / "data"

    @property
    def host(self) -> str:
        """The socket directory: libpq's `host` for a Unix socket."""
        return str(self.dir)

    def dsn(self, dbname: str = "postgres") -> str:
        """A libpq URI (psycopg and asyncpg both take it) for one database, over the socket."""
        return f"postgresql://{SUPERUSER}@/{dbname}?host={quote(self.host, safe='')}&port={PORT}"

    def _run(self, *cmd: str, timeout: float = 120) -> str:
        try:
            done = subprocess.run(
                [*self.prefix, *cmd], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise NoPostgres(f"{' '.join(cmd[:2])} failed: {e}{self._log_tail()}") from None
        if done.returncode != 0:
            raise NoPostgres(
                f"{' '.join(cmd[:2])} exited {done.returncode}: {done.stderr.strip() or done.stdout.strip()}"
                f"{self._log_tail()}"
            )
        return done.stdout

    def _log_tail(self) -> str:
        log = self.dir / "server.log" if self.dir else None
        if log and log.exists():
            return "\nserver log:\n" + "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        return ""

    # -- start and stop ----------------------------------------------------------------------

    def start(self) -> Cluster:
        self.bindir = find_bindir()
        if os.geteuid() == 0:
            try:
                user = pwd.getpwnam("postgres")
            except KeyError:
                raise NoPostgres(
                    "running as root, and PostgreSQL refuses root: its server runs as the"
                    f" `postgres` system user, which does not exist ({INSTALL_HINT})"
                ) from None
            if not shutil.which("runuser"):
                raise NoPostgres("running as root: runuser (util-linux) is needed to run PostgreSQL as `postgres`")
            self.prefix = ["runuser", "-u", "postgres", "--"]
            self.owner_uid = user.pw_uid
        # In $TMPDIR or /tmp, never under pytest's tmp_path (its parent is root's alone, 0700),
        # and short: a Unix socket's path is at most 107 bytes.
        self.dir = Path(tempfile.mkdtemp(prefix="gpuq-pg-"))
        try:
            if self.prefix:
                os.chown(self.dir, user.pw_uid, user.pw_gid)
            pg_ctl = str(self.bindir / "pg_ctl")
            self._watchdog = subprocess.Popen(
                [sys.executable, "-c", WATCHDOG, pg_ctl, str(self.data), str(self.dir), *self.prefix],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            self._run(
                str(self.bindir / "initdb"),
                "-D",
                str(self.data),
                "-U",
                SUPERUSER,
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
                *([] if self.durable else ["--no-sync"]),
            )
            conf = {
                "listen_addresses": "''",
                "unix_socket_directories": f"'{self.dir}'",
                "port": str(PORT),
                "max_connections": "200",
                "shared_buffers": "32MB",
                **({} if self.durable else {"fsync": "off", "full_page_writes": "off"}),
                **self.settings,
            }
            with open(self.data / "postgresql.conf", "a") as f:
                f.write("\n# gpuq's throwaway cluster (tests/pg.py)\n")
                f.writelines(f"{k} = {v}\n" for k, v in conf.items())
            # Its own session: a Ctrl-C at the terminal stops the tests, which then stop it.
            try:
                done = self.pg_ctl("start")
            except subprocess.TimeoutExpired:
                raise NoPostgres(f"pg_ctl start did not finish within 90s{self._log_tail()}") from None
            if done.returncode != 0:
                raise NoPostgres(f"pg_ctl start exited {done.returncode}: {done.stderr.strip()}{self._log_tail()}")
        except BaseException:
            self.stop()
            raise
        return self

    def restart(self) -> None:
        """Stop the server (fast: every connection is cut) and start it again, as an upgrade or a
        crash of the database machine does."""
        done = self.pg_ctl("restart", "-m", "fast")
        if done.returncode != 0:
            raise NoPostgres(f"pg_ctl restart exited {done.returncode}: {done.stderr.strip()}{self._log_tail()}")

    def pg_ctl(self, *action: str) -> subprocess.CompletedProcess[str]:
        """pg_ctl on this cluster, waiting for it (60 s), its server's log in server.log; in a
        session of its own: a Ctrl-C at the terminal stops the tests, which then stop it."""
        return subprocess.run(
            [
                *self.prefix,
                str(self.bindir / "pg_ctl"),
                *action,
                "-w",
                "-t",
                "60",
                "-D",
                str(self.data),
                "-l",
                str(self.dir / "server.log"),
            ],
            capture_output=True,
            text=True,
            timeout=90,
            start_new_session=True,
            stdin=subprocess.DEVNULL,
        )

    def postmaster_pid(self) -> int:
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def stop(self) -> None:
        """Stop the server (fast, then immediate) and remove its dir. Safe to call twice."""
        if self.dir is None:
            return
        if (self.data / "postmaster.pid").exists():
            pg_ctl = str(self.bindir / "pg_ctl")
            for mode in ("fast", "immediate"):
                try:
                    done = subprocess.run(
                        [*self.prefix, pg_ctl, "stop", "-D", str(self.data), "-m", mode, "-w", "-t", "30"],
                        capture_output=True,
                        timeout=60,
                        stdin=subprocess.DEVNULL,
                    )
                    if done.returncode == 0:
                        break
                except subprocess.TimeoutExpired:
                    pass
        shutil.rmtree(self.dir, ignore_errors=True)
        if self._watchdog:
            self._watchdog.stdin.close()  # it finds nothing left to do
            try:
                self._watchdog.wait(60)
            except subprocess.TimeoutExpired:
                self._watchdog.kill()
                self._watchdog.wait()
            self._watchdog = None
        self.dir = None

    # -- databases ---------------------------------------------------------------------------

    def _admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
            conn.execute(sql)

    def create_database(self) -> str:
        """A fresh, empty database (a copy of template1, which initdb left empty); its name.
        Without fsync, a file copy (and the checkpoint it takes) is the quickest: about 15 ms."""
        with self._lock:
            self._count += 1
            name = f"test_{os.getpid()}_{self._count}"
        self._admin(f'CREATE DATABASE "{name}"' + ("" if self.durable else " STRATEGY FILE_COPY"))
        return name

    def drop_database(self, name: str) -> None:
        """Drop it, ending any connection a test left open."""
        self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
