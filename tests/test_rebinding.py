"""DNS rebinding: the router answers only to its own host names. A web page whose domain is made
to resolve to the router's address (after the page loaded) is same-origin with the router in
the browser's eyes, so only the Host header tells its requests apart: every route refuses a
Host that is not loopback, the listen address, public_url's host or in router.allowed_hosts.

The HTTP cases send requests as such a page would (its own Host, Origin and Sec-Fetch-Site)
to the real daemon; the browser case runs a real attacker page in headless Chromium."""

from __future__ import annotations

import asyncio
import json
import shutil

import aiohttp
import pytest
from aiohttp import web
from conftest import eventually, free_port, node_table
from playwright.async_api import async_playwright, expect
from test_page import CHROMIUM_ARGS, card, open_queue

from gpuq.access.hosts import router_hosts
from gpuq.config import ConfigError, Settings, parse_config

ATTACKER = "rebind.attacker.test"  # .test is reserved: this name never leaves the machine
SECRET = "the secret plan for the lab"
SAME_ORIGIN = "same-origin"


async def busy_router(fakes, daemon_factory, **router):
    """One node busy with a running job, and a waiting job whose prompt is the secret."""
    fake = await fakes("qwen3-coder:30b", token_delay_s=0.5, tokens=100_000)
    d = await daemon_factory([node_table("node-1", fake, 1, ["task", "critique"], "qwen3-coder:30b")], **router)
    d.port = int(d.url.rsplit(":", 1)[1])
    return d


async def running_and_waiting(d, headers: dict | None = None) -> tuple[str, str]:
    status, body = await d.request("POST", "/api/jobs", {"kind": "task", "prompt": "running head"}, headers=headers)
    assert status == 201, body
    head = body["jobs"][0]["id"]

    async def running():
        return (await d.request("GET", f"/api/jobs/{head}", headers=headers))[1]["state"] == "running"

    await eventually(running, what=f"job {head} to run")
    status, body = await d.request("POST", "/api/jobs", {"kind": "task", "prompt": SECRET}, headers=headers)
    assert status == 201, body
    return head, body["jobs"][0]["id"]


async def snapshot(d, headers: dict | None = None) -> list[tuple]:
    status, body = await d.request("GET", "/api/jobs?limit=1000", headers=headers)
    assert status == 200, body
    return sorted(
        (j["id"], j["state"], j["node"], j.get("position"), j["prompt_excerpt"], j["prompt_bytes"])
        for j in body["jobs"]
    )


async def ask(d, method: str, path: str, host: str, body=None, headers: dict | None = None) -> tuple[int, str]:
    """A request as a page on `host` sends it (same-origin to the browser). Streams are read
    only as far as their first piece, so a stream that was let through cannot hang the test."""
    sent = {"Host": host, "Origin": f"http://{host}", "Sec-Fetch-Site": SAME_ORIGIN, **(headers or {})}
    async with d.session.request(
        method, d.url + path, json=body, headers=sent, timeout=aiohttp.ClientTimeout(total=10)
    ) as resp:
        if resp.status == 421:
            return resp.status, await resp.text()
        return resp.status, (await resp.content.read(65536)).decode("utf-8", "replace")


def every_route(head: str, job: str) -> list[tuple]:
    return [
        ("GET", "/api/jobs", None),
        ("GET", "/api/queue", None),
        ("GET", f"/api/jobs/{job}", None),
        ("GET", f"/api/jobs/{head}/stream", None),
        ("GET", "/api/events", None),
        ("GET", "/api/nodes", None),
        ("GET", "/api/models", None),
        ("GET", "/api/stale", None),
        ("GET", "/health", None),
        ("GET", "/", None),
        ("GET", f"/jobs/{job}", None),
        ("GET", "/static/queue.js", None),
        ("GET", "/no/such/route", None),
        ("POST", "/api/jobs", {"kind": "task", "prompt": "planted by the attacker"}),
        ("DELETE", f"/api/jobs/{job}", None),
        ("DELETE", f"/api/jobs/{head}", None),
        ("POST", f"/api/jobs/{job}/preempt", None),
        ("POST", f"/api/jobs/{job}/move", {"position": 1}),
        ("POST", "/api/nodes/node-1/clear", {"running": True}),
    ]


def assert_refused(status: int, text: str, host_name: str, what: str) -> None:
    assert status == 421, (what, status, text[:300])
    error = json.loads(text)["error"]
    assert error["status"] == 421, what
    assert f"host '{host_name}'" in error["message"] and "router.allowed_hosts" in error["message"], error
    assert SECRET not in text, what


# -- plain HTTP against the real daemon ---------------------------------------------------------


@pytest.mark.parametrize(
    "host",
    [f"{ATTACKER}:{{port}}", ATTACKER.upper(), f"localhost.{ATTACKER}:{{port}}", f"127.0.0.1.{ATTACKER}:{{port}}"],
)
async def test_a_foreign_host_is_refused_on_every_route_and_changes_nothing(host, fakes, daemon_factory):
    d = await busy_router(fakes, daemon_factory)
    head, job = await running_and_waiting(d)
    before = await snapshot(d)
    host = host.format(port=d.port)
    for method, path, body in every_route(head, job):
        status, text = await ask(d, method, path, host, body)
        assert_refused(status, text, host.split(":")[0].lower(), f"{method} {path}")
    assert await snapshot(d) == before
    assert (await d.job(job))["state"] == "queued" and (await d.job(head))["state"] == "running"


async def test_the_host_check_comes_before_the_token(fakes, daemon_factory):
    d = await busy_router(fakes, daemon_factory, token="tok-rebind")
    auth = {"Authorization": "Bearer tok-rebind"}
    head, job = await running_and_waiting(d, headers=auth)
    before = await snapshot(d, headers=auth)
    for extra in ({}, auth):  # no token: refused for the host, not asked for a token
        status, text = await ask(d, "GET", "/api/jobs", f"{ATTACKER}:{d.port}", headers=extra)
        assert_refused(status, text, ATTACKER, f"GET /api/jobs with {extra}")
        status, text = await ask(d, "DELETE", f"/api/jobs/{job}", f"{ATTACKER}:{d.port}", headers=extra)
        assert_refused(status, text, ATTACKER, f"DELETE with {extra}")
    assert await snapshot(d, headers=auth) == before
    status, _ = await ask(d, "GET", "/api/jobs", f"localhost:{d.port}")
    assert status == 401  # a known name still needs the token


async def test_loopback_names_public_url_and_allowed_hosts_are_accepted(fakes, daemon_factory):
    port = free_port()  # public_url names the router by a name only the config knows
    d = await busy_router(
        fakes,
        daemon_factory,
        public_url=f"http://Router.Lab.test:{port}",
        allowed_hosts=["Box.Tailnet.test.", "fd7a:115c::1"],
    )
    head, job = await running_and_waiting(d)
    hosts = [
        f"localhost:{d.port}",
        f"LocalHost:{d.port}",
        "localhost",
        f"127.0.0.1:{d.port}",
        f"[::1]:{d.port}",
        f"router.lab.test:{port}",
        "box.tailnet.test:1234",
        f"BOX.tailnet.test.:{d.port}",
        f"[fd7a:115c:0::1]:{d.port}",
    ]
    for host in hosts:
        status, text = await ask(d, "GET", "/api/jobs", host)
        assert status == 200 and SECRET in text, (host, status, text[:300])
        status, text = await ask(d, "GET", "/", host)
        assert status == 200 and "<html" in text.lower(), host
        async with d.session.get(d.url + "/api/events", headers={"Host": host}) as resp:
            assert resp.status == 200, host
            assert (await resp.content.readline()).startswith(b"retry:")
    status, text = await ask(d, "DELETE", f"/api/jobs/{job}", f"box.tailnet.test:{d.port}")
    assert status == 200, text  # the Origin check still lets the router's own page change the queue
    assert (await d.job(job))["state"] == "cancelled"
    # The Origin check still refuses another site, even when the Host is one of the router's.
    status, text = await ask(
        d,
        "DELETE",
        f"/api/jobs/{head}",
        f"localhost:{d.port}",
        headers={"Origin": f"http://{ATTACKER}:{d.port}", "Sec-Fetch-Site": "cross-site"},
    )
    assert status == 403 and "cross-site request refused" in text


async def raw_request(d, raw: bytes) -> tuple[int, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", d.port)
    try:
        writer.write(raw)
        data = await asyncio.wait_for(reader.read(), 10)  # Connection: close: read to the end
    finally:
        writer.close()
        await writer.wait_closed()
    head, _, body = data.decode("utf-8", "replace").partition("\r\n\r\n")
    return int(head.split(" ", 2)[1]), body


@pytest.mark.parametrize(
    "request_line",
    [
        b"GET /api/jobs HTTP/1.0\r\n",
        b"GET /api/jobs HTTP/1.1\r\n",
        b"GET /api/jobs HTTP/1.1\r\nHost: \r\n",
        b"DELETE /api/jobs/{job} HTTP/1.1\r\n",
    ],
)
async def test_a_request_without_a_host_is_refused(request_line, fakes, daemon_factory):
    d = await busy_router(fakes, daemon_factory)
    _, job = await running_and_waiting(d)
    before = await snapshot(d)
    status, body = await raw_request(d, request_line.replace(b"{job}", job.encode()) + b"Connection: close\r\n\r\n")
    assert status == 421, body
    error = json.loads(body)["error"]
    assert error["status"] == 421 and "Host header" in error["message"] and "router.allowed_hosts" in error["message"]
    assert SECRET not in body
    assert await snapshot(d) == before


def test_a_wildcard_listen_answers_only_to_loopback_public_url_and_allowed_hosts():
    settings = Settings(
        listen="0.0.0.0:8750", public_url="http://gpu-box.tailnet.test:8750", allowed_hosts=("192.168.1.20",)
    )
    assert router_hosts(settings) == {"localhost", "127.0.0.1", "::1", "gpu-box.tailnet.test", "192.168.1.20"}
    assert "::" not in router_hosts(Settings(listen="[::]:8750", public_url="http://[::1]:8750"))
    assert "100.64.0.7" in router_hosts(Settings(listen="100.64.0.7:8750", public_url="http://box:8750"))


# -- config ---------------------------------------------------------------------------------------


def nodes_only(**router) -> dict:
    return {
        "router": router,
        "node": [{"name": "n1", "url": "http://n1:11434", "rank": 1, "roles": ["task"], "model": "m"}],
    }


def test_allowed_hosts_are_kept_in_the_form_the_host_header_is_compared_in(tmp_path):
    settings = parse_config(
        nodes_only(allowed_hosts=["MyBox.Tailnet.ts.net.", "[FD7A:115C::1]", "100.64.0.7", "gpu_box"]), tmp_path
    )
    assert settings.allowed_hosts == ("mybox.tailnet.ts.net", "fd7a:115c::1", "100.64.0.7", "gpu_box")
    assert parse_config(nodes_only(), tmp_path).allowed_hosts == ()


BAD_HOSTS = {
    "a string": (
        "mybox",
        "router.allowed_hosts: expected a list of host names like [\"mybox.tailnet.ts.net\"], got 'mybox'",
    ),
    "a number in the list": (["ok.test", 5], "router.allowed_hosts[2]: expected a host name (a string), got 5"),
    "a URL": (
        ["http://mybox:8750"],
        "router.allowed_hosts[1]: write the host name alone, not a URL, got 'http://mybox:8750'",
    ),
    "a port": (["mybox:8750"], "router.allowed_hosts[1]: leave the port out (any port is accepted), got 'mybox:8750'"),
    "a wildcard": (
        ["*.ts.net"],
        "router.allowed_hosts[1]: wildcards are not supported, list each host name, got '*.ts.net'",
    ),
    "empty": ([""], "router.allowed_hosts[1]: expected a host name or IP address, got ''"),
    "a space": (["my box"], "router.allowed_hosts[1]: expected a host name or IP address, got 'my box'"),
    "a bad label": (["-box.test"], "router.allowed_hosts[1]: expected a host name or IP address, got '-box.test'"),
}


@pytest.mark.parametrize("name", list(BAD_HOSTS))
def test_each_allowed_hosts_mistake_names_the_key(name, tmp_path):
    value, message = BAD_HOSTS[name]
    with pytest.raises(ConfigError) as exc:
        parse_config(nodes_only(allowed_hosts=value), tmp_path)
    assert exc.value.message == message


@pytest.mark.parametrize("value", [["mybox:8750"], "mybox"])
async def test_serve_exits_78_on_a_bad_allowed_hosts(value, fakes, daemon_factory):
    fake = await fakes()
    d = await daemon_factory([node_table("n1", fake, 1, ["task"], "m")], start=False, allowed_hosts=value)
    res = await d.cli("serve", "--config", str(d.config))
    assert res.code == 78, res.err
    assert res.err.startswith("gpuq: config error: router.allowed_hosts"), res.err


# -- a real attacker page in headless Chromium --------------------------------------------------

ATTACK_PAGE = """<!doctype html><meta charset="utf-8"><title>cute cats</title><pre id="out"></pre>
<script>
(async () => {
  const victim = new URLSearchParams(location.search).get('victim');
  const json = {'Content-Type': 'application/json'};
  const loot = {origin: location.origin};
  async function grab(name, path, init) {
    try {
      const resp = await fetch(path, init);
      loot[name] = {status: resp.status, body: await resp.text()};
    } catch (err) {
      loot[name] = {status: 0, body: String(err)};
    }
  }
  await grab('jobs', '/api/jobs');
  await grab('queue', '/api/queue');
  await grab('job', '/api/jobs/' + victim);
  await grab('page', '/');
  await grab('submit', '/api/jobs', {method: 'POST', headers: json,
    body: JSON.stringify({kind: 'task', prompt: 'planted by the attacker', node: 'node-3'})});
  await grab('delete', '/api/jobs/' + victim, {method: 'DELETE'});
  await grab('clear', '/api/nodes/node-3/clear', {method: 'POST', headers: json, body: '{"running": true}'});
  loot.events = await new Promise((resolve) => {
    const source = new EventSource('/api/events');
    source.onopen = () => { source.close(); resolve('open'); };
    source.onerror = () => { source.close(); resolve('refused'); };
  });
  document.getElementById('out').textContent = JSON.stringify(loot);
  window.stolen = loot;
})();
</script>"""


@pytest.fixture
async def attacker_site():
    """The attacker's web server, on loopback, serving the page that runs the attack."""
    app = web.Application()
    served = []

    async def attack(request):
        served.append(request.path)
        return web.Response(text=ATTACK_PAGE, content_type="text/html")

    app.router.add_get("/attack.html", attack)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield f"http://127.0.0.1:{port}", served
    await runner.cleanup()


@pytest.mark.browser
async def test_a_rebinding_page_in_chromium_reads_nothing_and_changes_nothing(lab, attacker_site):
    """Chromium resolves the attacker's name to the router's address (--host-resolver-rules),
    as after a rebind. The page's own first load still comes from the attacker's server (the
    answer before the rebind): Playwright sends that one request there without the page seeing
    it, so the page's origin is the attacker's name on the router's port, and every later
    request of the page goes to the router."""
    attacker_url, served = attacker_site
    lab.fakes["node-3"].script.token_delay_s = 0.5
    lab.fakes["node-3"].script.tokens = 100_000
    head = (await lab.submit("task", "running head", node="node-3"))[0]["id"]
    await lab.wait_state(head, "running")
    victim = (await lab.submit("task", SECRET, node="node-3"))[0]["id"]
    before = await snapshot(lab)
    port = int(lab.url.rsplit(":", 1)[1])
    rebound = f"http://{ATTACKER}:{port}"

    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    async with async_playwright() as p:
        browser = await p.chromium.launch(
            executable_path=chromium, args=[*CHROMIUM_ARGS, f"--host-resolver-rules=MAP {ATTACKER} 127.0.0.1"]
        )
        try:
            evil = await browser.new_context()
            await evil.route(
                f"{rebound}/attack.html*",
                lambda route: route.continue_(url=route.request.url.replace(rebound, attacker_url)),
            )
            attack = await evil.new_page()
            await attack.goto(f"{rebound}/attack.html?victim={victim}")
            assert served == ["/attack.html"]
            await attack.wait_for_function("window.stolen !== undefined", timeout=30_000)
            loot = await attack.evaluate("window.stolen")
            assert loot["origin"] == rebound
            for what in ("jobs", "queue", "job", "page", "submit", "delete", "clear"):
                assert_refused(loot[what]["status"], loot[what]["body"], ATTACKER, what)
            assert loot["events"] == "refused"
            await evil.close()

            assert await snapshot(lab) == before  # nothing planted, deleted or cleared
            assert (await lab.job(victim))["state"] == "queued"

            # The real page, on the router's own address, in the same browser, still works.
            mine = await browser.new_context(viewport={"width": 1400, "height": 900})
            page = await mine.new_page()
            await open_queue(page, lab)
            await expect(page.locator(f"{card(victim)} .prompt")).to_have_text(SECRET)
            await expect(page.locator(f".running-slot {card(head)}")).to_be_visible()
            await page.locator(card(victim)).get_by_role("button", name="Delete").click()
            await page.locator("dialog[open]").get_by_role("button", name="Delete").click()
            await lab.wait_state(victim, "cancelled")
            await expect(page.locator(card(victim))).to_have_count(0)
            await mine.close()
        finally:
            await browser.close()
