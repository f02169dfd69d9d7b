"""The queue page's footer and warnings for backups, the retention sweep and the storage budget
(issue 35), in real headless Chromium against the real daemon: the footer says when the last
backup succeeded and where, what the last retention sweep did, and the database's size and the
free space on its disk; a scheduled backup (or a sweep) that fails shows as a BACKUP (RETENTION)
warning above the board while the queue goes on, and leaves once one succeeds."""

from __future__ import annotations

import re
import tomllib

import pytest
import tomli_w
from conftest import node_table
from playwright.async_api import Page, expect
from test_page import browser, page  # noqa: F401 (fixtures)
from test_retention_health import aged_jobs, router

pytestmark = pytest.mark.browser

expect.set_options(timeout=15_000)
MODEL = "qwen3-coder:30b"


async def test_the_footer_shows_the_last_backup_and_storage_and_a_failing_backup_warns(
    fakes, daemon_factory, page: Page, tmp_path
):
    fake = await fakes(MODEL)
    daemon = await daemon_factory([node_table("node-1", fake, 1, ["task"], MODEL)], start=False)
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the backups' folder should be")
    data = tomllib.loads(daemon.config.read_text())
    data["backup"] = {"every": "1s", "dir": str(blocked)}
    daemon.config.write_text(tomli_w.dumps(data))
    await daemon.start()
    await page.goto(daemon.url + "/")
    warning = page.locator('#alerts [data-warning="upkeep"]', has_text="the scheduled backup to")
    await expect(warning).to_contain_text("BACKUP")
    await expect(warning).to_contain_text("cannot make the backup folder")
    await expect(page.locator("#upkeep-backup")).to_contain_text("No backup yet")
    await expect(page.locator("#upkeep-backup")).to_have_class("warn")
    await expect(page.locator("#upkeep-storage")).to_contain_text(
        re.compile(r"Database \d+\.\d [kM]B \(growth not known yet\) · \d+\.\d [GT]B free on its disk")
    )
    # The queue goes on meanwhile.
    job = (await daemon.submit("task", "still served"))[0]["id"]
    await daemon.wait_state(job, "done")
    good = tmp_path / "backups"
    data["backup"] = {"every": "1s", "dir": str(good)}
    daemon.config.write_text(tomli_w.dumps(data))
    assert (await daemon.cli("reload")).code == 0
    await expect(page.locator("#upkeep-backup")).to_contain_text(f"ago: {good}/gpuq-")
    await expect(page.locator('#alerts [data-warning="upkeep"]')).to_have_count(0)
    await expect(page.locator("#upkeep-backup")).not_to_have_class("warn")


async def test_the_footer_shows_the_last_retention_sweep_and_a_failing_one_warns(
    fakes, daemon_factory, page: Page, tmp_path
):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    daemon = await router(fakes, daemon_factory, {"every": "1s", "archive": str(blocked / "archive")})
    old = await aged_jobs(daemon, 2, 400)  # due to be deleted, archived first: the archive refuses
    await page.goto(daemon.url + "/")
    warning = page.locator('#alerts [data-warning="upkeep"]', has_text="the retention sweep failed")
    await expect(warning).to_contain_text("RETENTION")
    await expect(warning).to_contain_text("cannot be written")
    sweep = page.locator("#upkeep-retention")
    await expect(sweep).to_contain_text(re.compile(r"Last sweep FAILED \S+ ago · next "))
    await expect(sweep).to_have_class("warn")
    assert "the last retention sweep failed: the retention archive" in (await sweep.get_attribute("title") or "")
    data = tomllib.loads(daemon.config.read_text())
    data["retention"]["archive"] = str(tmp_path / "archive")
    daemon.config.write_text(tomli_w.dumps(data))
    assert (await daemon.cli("reload")).code == 0
    # The sweep after the mend deletes the two; the footer then shows each newer sweep's counts.
    await expect(page.locator('#alerts [data-warning="upkeep"]')).to_have_count(0)
    await expect(sweep).to_contain_text(re.compile(r"Last sweep \S+ ago: pruned \d+, deleted \d+, archived "))
    await expect(sweep).not_to_have_class("warn")
    assert "longest hold of the database's writer" in (await sweep.get_attribute("title") or "")
    assert all([(await daemon.request("GET", f"/api/jobs/{j}"))[0] == 404 for j in old])
