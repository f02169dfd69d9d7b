"""A normal install serves: the wheel, built from the sdist as a release build does it, carries
the pages and the migrations, and `gpuq serve` from a fresh venv outside the source tree runs a
job and serves its pages. Offline: built without build isolation, installed without its
dependencies, which a .pth line lends from the venv running the tests (a .pth inside a plain
path entry is not processed, so that venv's editable gpuq stays out of sight)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT, free_port, node_table

# Never copied to the build: the dev's venv, git, caches and databases, earlier build output.
NOT_SOURCE = shutil.ignore_patterns(
    ".venv",
    ".git",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".pytest_cache",
    ".hypothesis",
    "test-artifacts",
    "*.db",
    "*.db-*",
)


def run(*cmd: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """gpuq's wheel, built from its sdist, built from a copy of this tree (which stays clean)."""
    work = tmp_path_factory.mktemp("build")
    shutil.copytree(ROOT, work / "tree", ignore=NOT_SOURCE)
    sdist = run(
        sys.executable,
        "-c",
        "import sys, setuptools.build_meta as b; print(b.build_sdist(sys.argv[1]))",
        work / "dist",
        cwd=work / "tree",
    ).stdout.split()[-1]
    with tarfile.open(work / "dist" / sdist) as tar:
        tar.extractall(work / "sdist", **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    unpacked = next((work / "sdist").iterdir())
    run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-q",
        "--no-deps",
        "--no-index",
        "--no-build-isolation",
        "-w",
        work / "dist",
        unpacked,
    )
    return next((work / "dist").glob("gpuq-*.whl"))


def install(wheel: Path, venv: Path) -> Path:
    """A fresh venv holding gpuq from `wheel` and this venv's dependencies; its site-packages."""
    run(sys.executable, "-m", "venv", "--without-pip", venv)
    run(
        sys.executable,
        "-m",
        "pip",
        "--python",
        venv / "bin" / "python",
        "install",
        "-q",
        "--no-deps",
        "--no-index",
        wheel,
    )
    site = Path(
        run(
            venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", cwd=venv
        ).stdout.strip()
    )
    ours = dict.fromkeys(sysconfig.get_path(p) for p in ("purelib", "platlib"))
    (site / "test_dependencies.pth").write_text("".join(f"{p}\n" for p in ours))
    return site


async def test_installed_wheel_serves_a_job_and_its_pages(wheel, tmp_path, fakes, daemon_factory):
    venv = tmp_path / "venv"
    site = install(wheel, venv)
    gpuq_file = run(venv / "bin" / "python", "-c", "import gpuq; print(gpuq.__file__)", cwd=tmp_path).stdout.strip()
    assert Path(gpuq_file).resolve() == (site / "gpuq" / "__init__.py").resolve()  # the wheel's, not the tree's

    fake = await fakes("qwen3-coder:30b")
    daemon = await daemon_factory(
        [node_table("node-1", fake, 1, ["task"], "qwen3-coder:30b")], command=(str(venv / "bin" / "gpuq"),)
    )
    result = await daemon.cli("task", "write a haiku about wheels", "--wait")
    assert result.code == 0, result
    job_id = result.out.split()[0]
    assert (await daemon.job(job_id))["state"] == "done"

    status, page = await daemon.request("GET", "/")
    assert (status, page) == (200, (site / "gpuq" / "web" / "index.html").read_text())
    status, preview = await daemon.request("GET", f"/jobs/{job_id}")
    assert (status, preview) == (200, (site / "gpuq" / "web" / "job.html").read_text())
    marker = "\n/* the installed copy */\n"  # shows the served file is the wheel's, not the tree's
    with open(site / "gpuq" / "web" / "style.css", "a") as css:
        css.write(marker)
    status, css = await daemon.request("GET", "/static/style.css")
    assert status == 200 and css.endswith(marker)


def test_the_wheel_carries_every_migration_of_both_engines(wheel):
    """SQLite's migrations and PostgreSQL's (migrations/postgres/, issue 27) ship in the wheel."""
    with zipfile.ZipFile(wheel) as whl:
        shipped = {name for name in whl.namelist() if name.endswith(".sql")}
    ours = {
        f"gpuq/store/migrations/{f.relative_to(ROOT / 'migrations').as_posix()}"
        for f in (ROOT / "migrations").rglob("*.sql")
    }
    assert any("/postgres/" in name for name in ours)
    assert shipped == ours


def serve_demo(venv: Path, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [venv / "bin" / "gpuq", "serve", "--demo", "--listen", f"127.0.0.1:{free_port()}"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_an_install_missing_its_migrations_or_pages_stops_serve_with_exit_2(wheel, tmp_path):
    venv = tmp_path / "venv"
    shipped = install(wheel, venv) / "gpuq"
    for sql in (shipped / "store" / "migrations").glob("*.sql"):
        sql.unlink()
    result = serve_demo(venv, tmp_path)
    assert result.returncode == 2, result
    assert f"no migrations found in {shipped / 'store' / 'migrations'}" in result.stderr
    assert "this gpuq installation is incomplete; reinstall gpuq" in result.stderr

    shutil.rmtree(shipped / "web")
    result = serve_demo(venv, tmp_path)
    assert result.returncode == 2, result
    assert f"no pages found in {shipped / 'web'}" in result.stderr
