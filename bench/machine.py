"""The machine a run measured: the disk's write cache under the databases, the CPU, the
versions and the mounts, for the table's footer and results.json's `meta`."""

from __future__ import annotations

import os
import platform
import sqlite3
from pathlib import Path


def disk_write_cache(path: Path) -> dict:
    """The write-cache mode of the block device holding `path`, from sysfs: "write back" (the
    disk acknowledges writes from a volatile cache, so each fsync also sends a cache flush) or
    "write through"; and whether it honours FUA writes. A virtual disk reports what the
    hypervisor exposes, not what its host does. "unknown" where sysfs cannot say (not Linux, an
    overlay or tmpfs without a block device)."""
    info = {"device": "unknown", "write_cache": "unknown", "fua": "unknown"}
    try:
        dev = os.stat(path).st_dev
        block = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}").resolve(strict=True)
    except OSError:
        return info
    info["device"] = block.name
    for holder in (block, block.parent):  # a partition's queue is its disk's
        try:
            info["write_cache"] = (holder / "queue" / "write_cache").read_text().strip()
        except OSError:
            continue
        try:
            info["fua"] = (holder / "queue" / "fua").read_text().strip()
        except OSError:
            pass
        break
    return info


def machine() -> dict:
    mounts = {}
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            dev, mnt, fs = line.split()[:3]
            mounts[mnt] = f"{fs} ({dev})"
    except OSError:
        pass
    cpu = ""
    try:
        cpu = next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            "",
        )
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "platform": platform.platform(),
        "mounts": mounts,
    }
