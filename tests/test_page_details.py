"""Page details a new user hit (issue 24), in real headless Chromium at a phone's width (400 px)
and a laptop's (1400 px), against the real daemon and fake Ollama nodes: a wrong access token is
refused on the page as soon as the router says so (never an empty-looking "No job has finished
yet." meanwhile); a delete dialog names the job by its prompt's start too; the job page's "Via"
and tokens cells are whole at 1400 px; the history shows each job's prompt at 400 px."""

from __future__ import annotations

import re

import aiohttp
import pytest
from conftest import eventually, free_port, make_lab, node_table
from playwright.async_api import Page, expect
from test_page import HOSTILE, browser, busy, card, head  # noqa: F401 (browser: a fixture)
from test_page_widths import LAPTOP, PHONE, open_at  # noqa: F401 (open_at: a fixture)

pytestmark = pytest.mark.browser

TOKEN = "the-right-token-for-the-details-test"
NOTHING_YET = "No job has finished yet."
SIZES = pytest.mark.parametrize("size", [PHONE, LAPTOP], ids=["400", "1400"])

expect.set_options(timeout=15_000)

# Notes, from the page's first script on, whether "No job has finished yet." was ever on screen.
WATCH_EMPTY = """(() => {
  window.__sawNothingYet = false;
  const look = () => {
    if (document.body && document.body.innerText.includes(NOTHING_YET)) window.__sawNothingYet = true;
  };
  new MutationObserver(look).observe(document, {subtree: true, childList: true, characterData: true});
})();""".replace("NOTHING_YET", repr(NOTHING_YET))


async def wrong_token_page(open_at, size: dict) -> Page:
    """A page whose browser holds a token the router refuses, watched for 'No job has finished yet.'"""
    page = await open_at(size)
    await page.add_init_script("localStorage.setItem('gpuq-token', 'a-stale-token')")
    await page.add_init_script(WATCH_EMPTY)
    return page


def dialog_text(prompt: str, size: int = 60) -> str:
    """The prompt's start as a dialog quotes it: one line, about 60 characters."""
    flat = re.sub(r"\s+", " ", prompt).strip()
    return f"“{flat[: size - 1] + '…' if len(flat) > size else flat}”"


# -- a wrong token --------------------------------------------------------------------------------


@SIZES
async def test_a_wrong_token_is_refused_on_the_queue_page_at_once(fakes, daemon_factory, open_at, size):
    lab = await make_lab(fakes, daemon_factory, token=TOKEN)
    page = await wrong_token_page(open_at, size)
    await page.goto(lab.url + "/")
    dialog = page.locator("dialog[open]")
    await expect(dialog).to_contain_text("The router refused the saved token")
    await dialog.locator("#token-input").fill("still-not-it")
    await dialog.get_by_role("button", name="Save token").click()

    # The first refresh's answers are on the screen: they say the refusal, whole.
    # A function, not an expression: Playwright polls an expression with eval, which the page's CSP
    # (script-src 'self') refuses whenever the first look is not already true.
    await page.wait_for_function("() => window.gpuq.shown >= 1")
    refusal = page.locator("#alerts .refusal")
    await expect(refusal).to_contain_text("Access token refused (401)")
    await expect(refusal).to_contain_text("missing or wrong token")
    await expect(refusal).to_contain_text("your token (gpuq.toml [[user]] or router.token")
    assert await page.evaluate("window.gpuq.refreshes") == 1  # not the 10 s poll's
    await expect(page.locator("#recent-body")).not_to_contain_text(NOTHING_YET)
    await expect(page.locator("#board")).to_contain_text("not loaded")
    assert await page.locator("dialog[open]").count() == 0  # the page says it: no form pops up by itself
    assert not await page.evaluate("window.__sawNothingYet")
    await expect(page.locator("#conn")).to_have_text("access refused")  # not "reconnecting…"

    # The alert's button takes the right token, and the queue shows.
    await refusal.get_by_role("button", name="Enter token").click()
    await dialog.locator("#token-input").fill(TOKEN)
    await dialog.get_by_role("button", name="Save token").click()
    await expect(page.locator(".col")).to_have_count(3)
    await expect(page.locator("#alerts .refusal")).to_have_count(0)
    await expect(page.locator("#recent-body")).to_contain_text(NOTHING_YET)  # now it is true
    await expect(page.locator("#conn")).to_have_text("live")


@SIZES
async def test_a_wrong_token_is_refused_on_the_history_and_job_pages(fakes, daemon_factory, open_at, size):
    lab = await make_lab(fakes, daemon_factory, token=TOKEN)
    status, body = await lab.request(
        "POST", "/api/jobs", {"kind": "task", "prompt": "a job to open"}, headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert status == 201, (status, body)
    job = body["jobs"][0]["id"]
    page = await wrong_token_page(open_at, size)

    await page.goto(lab.url + "/history")
    dialog = page.locator("dialog[open]")
    await expect(dialog).to_contain_text("The router refused the saved token")
    await dialog.get_by_role("button", name="Not now").click()
    refusal = page.locator("#jobs .refusal")
    await expect(refusal).to_contain_text("Access token refused (401)")
    await expect(refusal).to_contain_text("your token (gpuq.toml [[user]] or router.token")
    await expect(page.locator("#conn")).to_have_text("access refused")
    assert not await page.evaluate("window.__sawNothingYet")

    await page.goto(f"{lab.url}/jobs/{job}")
    await expect(dialog).to_contain_text("The router refused the saved token")
    await dialog.get_by_role("button", name="Not now").click()
    refusal = page.locator("#problem.refusal")
    await expect(refusal).to_contain_text("Access token refused (401)")
    await expect(refusal).to_contain_text("your token (gpuq.toml [[user]] or router.token")
    await refusal.get_by_role("button", name="Enter token").click()
    await dialog.locator("#token-input").fill(TOKEN)
    await dialog.get_by_role("button", name="Save token").click()
    await expect(page.locator(".job-title h1")).to_have_text(job)
    await expect(page.locator("#prompt")).to_have_text("a job to open")


# -- delete dialogs name the job by its prompt ----------------------------------------------------


async def test_a_lab_of_user_tokens_asks_for_your_token(fakes, daemon_factory, open_at):
    """Only [[user]] tokens, no router.token: the dialog does not send the person looking for a
    router.token that is not there (issue 36)."""
    from test_users import USERS, users_lab

    d = await users_lab(fakes, daemon_factory)
    page = await open_at(LAPTOP)
    await page.goto(d.url + "/")
    dialog = page.locator("dialog[open]")
    await expect(dialog).to_contain_text("Access token needed")
    await expect(dialog).to_contain_text("your token (gpuq.toml [[user]] or router.token)")
    await dialog.locator("#token-input").fill(USERS[0]["token"])
    await dialog.get_by_role("button", name="Save token").click()
    await expect(page.locator(".col")).to_have_count(1)
    await expect(page.locator("#conn")).to_have_text("live")


@SIZES
async def test_delete_dialogs_quote_the_prompts_start(lab, open_at, size):
    busy(lab.fakes["node-3"])
    running_prompt = "refactor the dispatcher\ninto one worker per node, then " + HOSTILE
    waiting_prompt = "  write the\n\ntests for the placement rules: the guard, the ranks and the roles " * 3
    running = await head(lab, "node-3", running_prompt)
    waiting = (await lab.submit("task", waiting_prompt, node="node-3"))[0]["id"]
    page = await open_at(size)
    await page.goto(lab.url + "/")
    dialog = page.locator("dialog[open]")

    await page.locator(card(waiting)).get_by_role("button", name="Delete").click()
    await expect(dialog).to_contain_text(f"Delete {waiting}?")
    await expect(dialog.locator(".dialog-quote")).to_have_text(dialog_text(waiting_prompt))
    await dialog.get_by_role("button", name="Cancel").click()

    await page.locator(card(running)).get_by_role("button", name="Delete").click()
    await expect(dialog.locator(".dialog-quote")).to_have_text(dialog_text(running_prompt))
    await dialog.get_by_role("button", name="Cancel").click()

    await page.goto(f"{lab.url}/jobs/{running}")
    await page.locator("#actions").get_by_role("button", name="Delete").click()
    await expect(dialog).to_contain_text(f"Delete {running}?")
    await expect(dialog.locator(".dialog-quote")).to_have_text(dialog_text(running_prompt))
    await dialog.get_by_role("button", name="Delete").click()
    await lab.wait_state(running, "cancelled")
    assert await page.evaluate("window.__pwned") is None  # quoted as text, never as HTML


# -- the job page's Via and tokens cells at 1400 px -----------------------------------------------

# Each fact's value cell, by its label: [label, text, the text's width, the cell's].
CELLS = """labels => [...document.querySelectorAll('.fact')]
  .map(f => [f.querySelector('dt').textContent, f.querySelector('dd')])
  .filter(([label]) => labels.includes(label))
  .map(([label, dd]) => [label, dd.textContent, dd.scrollWidth, dd.clientWidth])"""


async def test_via_and_tokens_are_whole_at_1400(fakes, daemon_factory, open_at):
    """A thinking model's job through the front door, running: its route and its thinking and
    answer counts are said whole on its page."""
    node = await fakes("qwen3:8b")
    node.script.thinking_tokens, node.script.tokens, node.script.token_delay_s = 6, 100_000, 0.05
    port = free_port()
    lab = await daemon_factory([node_table("node-1", node, 1, ["task"], "qwen3:8b")], ollama_listen=f"127.0.0.1:{port}")
    front = f"http://127.0.0.1:{port}"

    async def ready():
        try:
            async with lab.session.get(front + "/api/tags") as resp:
                return resp.status == 200 and len((await resp.json())["models"]) == 1
        except aiohttp.ClientError:
            return False

    await eventually(ready, 15, what="the front door to know qwen3:8b")
    call = lab.session.post(
        front + "/v1/chat/completions",
        json={
            "model": "qwen3:8b",
            "stream": True,
            "messages": [{"role": "user", "content": "think, then answer at length"}],
        },
    )
    resp = await call.__aenter__()
    try:
        assert resp.status == 200
        jobs = await eventually(lambda: _running(lab), 15, what="the front door's job to run")
        page = await open_at(LAPTOP)
        await page.goto(f"{lab.url}/jobs/{jobs[0]['id']}")
        await expect(page.locator(".fact", has_text="Via")).to_contain_text("/v1/chat/completions")
        await expect(page.locator("#f-tokens")).to_contain_text(re.compile(r"thinking 6 · answer \d{3,}"))
        cells = await page.evaluate(CELLS, ["Via", "Tokens so far"])
        assert len(cells) == 2, cells
        for label, text, scroll, client in cells:
            assert scroll <= client, f"{label} ({text!r}) is cut: {scroll} px of text in {client} px"
    finally:
        resp.close()


async def _running(lab) -> list[dict]:
    return (await lab.get("/api/jobs?state=running"))["jobs"]


# -- the history at 400 px ------------------------------------------------------------------------


async def expect_whole_on_screen(page, selector: str, text: str) -> None:
    """The cell shows `text` whole, within a phone's 400 px. Read in one turn of the page's script:
    the table is redrawn as the history changes."""
    await expect(page.locator(selector)).to_have_text(text)
    left, right, scroll, client = await page.evaluate(
        """sel => { const e = document.querySelector(sel);
        const r = e.getBoundingClientRect(); return [r.left, r.right, e.scrollWidth, e.clientWidth]; }""",
        selector,
    )
    assert left >= 0 and right <= 400, f"the prompt is off the screen: {left}..{right} px"
    assert scroll <= client, f"the prompt is cut: {scroll} px of text in {client} px"


async def test_history_shows_the_prompt_at_400(lab, open_at):
    lab.fakes["node-3"].script.tokens = 3
    prompt = "summarise the incident report in three bullet points for the weekly notes"
    job = (await lab.submit("task", prompt, node="node-3"))[0]["id"]
    await lab.wait_state(job, "done")
    page = await open_at(PHONE)
    await page.goto(lab.url + "/history")
    await expect_whole_on_screen(page, f'#history-table tr[data-id="{job}"] td.what', prompt)
    # The row's other facts are still there, under it.
    await expect(page.locator(f'#history-table tr[data-id="{job}"] a')).to_have_text(job)


async def test_recently_finished_shows_the_prompt_at_400(lab, open_at):
    """The queue page's own short history stacks as /history does: the prompt whole, on screen."""
    lab.fakes["node-3"].script.tokens = 3
    prompt = "list the three riskiest changes in last night's deploy and who reviewed each"
    job = (await lab.submit("task", prompt, node="node-3"))[0]["id"]
    await lab.wait_state(job, "done")
    page = await open_at(PHONE)
    await page.goto(lab.url + "/")
    await expect_whole_on_screen(page, f'#recent-body tr[data-id="{job}"] td.what', prompt)
    await expect(page.locator(f'#recent-body tr[data-id="{job}"] a')).to_have_text(job)
