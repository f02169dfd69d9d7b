"""The storage budget as a user meets it (issue 43, item 7), in real headless Chromium against the
real daemon: the footer says the database's growth with the window it was measured over and the
days until its disk is full at that growth; a nearly full disk is a STORAGE warning and a
disk_filling alert at once, with no hour of samples needed."""

from __future__ import annotations

import re
import sqlite3
import time

import pytest
from conftest import eventually, node_table
from playwright.async_api import Page, expect
from test_page import browser, page  # noqa: F401 (fixtures)
from test_scheduled_backups import set_tables

pytestmark = pytest.mark.browser

expect.set_options(timeout=15_000)
MODEL = "qwen3-coder:30b"


def an_older_sample(db, hours_ago: float, size: int) -> None:
    """A sample the router recorded earlier (as an older run of it leaves them)."""
    conn = sqlite3.connect(db)
    try:
        at = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(time.time() - hours_ago * 3600))
        conn.execute("INSERT INTO storage_sample (at, database_bytes, free_bytes) VALUES (?, ?, NULL)", (at, size))
        conn.commit()
    finally:
        conn.close()


async def test_the_footer_says_the_growth_window_and_days_to_full_and_a_nearly_full_disk_warns_at_once(
    fakes, daemon_factory, page: Page, tmp_path
):
    fake = await fakes(MODEL)
    daemon = await daemon_factory([node_table("node-1", fake, 1, ["task"], MODEL)])
    await daemon.kill(15)
    an_older_sample(tmp_path / "gpuq.db", 2, 1000)  # two hours ago the database was a kilobyte
    # More free space asked for than this disk has: it is "nearly full" for this router.
    set_tables(daemon.config, storage={"min_free_bytes": 1 << 60})
    await daemon.start()

    async def firing():
        alerts = (await daemon.get("/api/alerts"))["alerts"]
        return [a for a in alerts if a["alert"] == "disk_filling"]

    [alert] = await eventually(firing, 15, 0.1, "the disk_filling alert")
    assert alert["message"].startswith(f"the disk holding {tmp_path / 'gpuq.db'} is nearly full: ")
    assert "under [storage] min_free_bytes 1152921.5 TB" in alert["message"], alert

    # The samples: the one two hours old, and the newest (the router's first start's, a moment ago).
    st = (await daemon.get("/health"))["storage"]
    window = st["growth_window_s"]
    assert 7000 < window <= 7260 and st["days_until_full"] > 0, st

    await page.goto(daemon.url + "/")
    warning = page.locator('#alerts [data-warning="upkeep"]', has_text="is nearly full")
    await expect(warning).to_contain_text("STORAGE")
    storage = page.locator("#upkeep-storage")
    await expect(storage).to_contain_text(
        re.compile(
            rf"Database \d+\.\d kB \(\+\d+\.\d [kM]B/day over the last {window // 3600}h {window % 3600 // 60:02d}m\)"
            r" · \d+\.\d [GT]B free on its disk, full in about \d+(\.\d)? days at that growth"
        )
    )
    await expect(storage).to_have_class("warn")
