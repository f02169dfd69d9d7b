"""Requests Ollama accepts that the front door refused: a chat with a photo (the body limit was
the prompt's), a browser page or an Electron app on another origin (CORS, as Ollama serves it),
and the names a client reaches this machine by (host.docker.internal, a LAN address, *.local,
the hostname, the tailnet's MagicDNS name). Against the real daemon, with simulated nodes, on
loopback; the Host header is set by hand to stand for each name."""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import stat
import tomllib

import aiohttp
import ollama
import pytest
import tomli_w
from conftest import eventually, free_port, node_table
from test_front import CHAT_MODEL, FrontLab

from gpuq.config import ConfigError, parse_config

MAGIC_DNS = "gpu-box.tail1234.ts.net"
TAILNET_IP = "100.101.102.103"
FAKE_TAILSCALE = f"""#!/bin/sh
# stands in for `tailscale status --json --peers=false`
echo '{
    json.dumps(
        {
            "BackendState": "Running",
            "Self": {
                "HostName": "gpu-box",
                "DNSName": MAGIC_DNS + ".",
                "TailscaleIPs": [TAILNET_IP, "fd7a:115c:a1e0::1"],
            },
        }
    )
}'
"""


async def start_lab(fakes, daemon_factory, front: dict | None = None, env: dict | None = None, **router) -> FrontLab:
    """One task node behind the front door; `front` is the config's [front] table."""
    node = await fakes(CHAT_MODEL)
    port = free_port()
    d = await daemon_factory(
        [node_table("node-1", node, 1, ["task"], CHAT_MODEL)],
        start=False,
        env=env,
        ollama_listen=f"127.0.0.1:{port}",
        stall_timeout="60s",
        **router,
    )
    if front is not None:
        data = tomllib.loads(d.config.read_text())
        d.config.write_text(tomli_w.dumps({**data, "front": front}))
    await d.start()
    lab = FrontLab(d, f"http://127.0.0.1:{port}", {"node-1": node})
    auth = {"Authorization": f"Bearer {router['token']}"} if router.get("token") else {}

    async def ready():
        async with d.session.get(lab.url + "/api/tags", headers=auth) as resp:
            return resp.status == 200 and (await resp.json())["models"]

    await eventually(ready, 10, what="the front door to know the node's model")
    return lab


@pytest.fixture
async def front(fakes, daemon_factory):
    lab = await start_lab(fakes, daemon_factory)
    yield lab
    await lab.close()


def photo(size: int) -> bytes:
    """A pretend JPEG of `size` bytes (random: base64 cannot shrink it)."""
    return b"\xff\xd8\xff\xe0" + os.urandom(size - 4)


# -- images -------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [1_600_000, 20_000_000])
async def test_a_chat_with_a_photo_is_answered(size, front):
    """A 1.6 MB image was 413 (the body limit was max_prompt_bytes + 64 KiB); a 20 MB phone
    photo (27 MB in base64) passes the default front.max_request_bytes."""
    image = photo(size)
    reply = await front.ollama(timeout=120).chat(
        model=CHAT_MODEL, messages=[{"role": "user", "content": "what is in this photo?", "images": [image]}]
    )
    assert reply.done and reply.message.content
    sent = [r for r in front.fakes["node-1"].requests if r.get("messages")]
    assert sent[-1]["messages"][-1]["images"] == [base64.b64encode(image).decode()]
    job = await front.job_with("what is in this photo? [1 image]", "done")  # the queue counts it
    assert job["node"] == "node-1"


async def test_the_text_is_still_held_to_max_prompt_bytes_and_the_request_to_its_own_limit(fakes, daemon_factory):
    lab = await start_lab(fakes, daemon_factory, front={"max_request_bytes": 2 << 20}, max_prompt_bytes=100_000)
    try:
        client = lab.ollama(timeout=60)
        reply = await client.chat(
            model=CHAT_MODEL,
            messages=[{"role": "user", "content": "small text, big image", "images": [photo(1_200_000)]}],
        )
        assert reply.done
        with pytest.raises(ollama.ResponseError) as exc:  # text over max_prompt_bytes, in a small body
            await client.chat(model=CHAT_MODEL, messages=[{"role": "user", "content": "x" * 150_000}])
        assert exc.value.status_code == 413
        text = 150_000 + len(CHAT_MODEL) + len("user")  # every string of the request but its images
        assert exc.value.error == (
            f"request text is {text} bytes (images not counted), over the limit of 100000 (router.max_prompt_bytes)"
        ), exc.value.error
        with pytest.raises(ollama.ResponseError) as exc:  # a body over front.max_request_bytes
            await client.chat(
                model=CHAT_MODEL, messages=[{"role": "user", "content": "too big", "images": [photo(2_000_000)]}]
            )
        assert exc.value.status_code == 413 and "front.max_request_bytes" in exc.value.error
        assert [j["prompt_excerpt"] for j in await lab.jobs()] == ["small text, big image [1 image]"]
    finally:
        await lab.close()


# -- CORS ---------------------------------------------------------------------------------------

DEFAULT_ORIGIN_KINDS = [
    "http://localhost:3000",
    "https://localhost",
    "http://127.0.0.1:5173",
    "https://0.0.0.0:8443",
    "app://obsidian.md",
    "file://",
    "tauri://localhost",
    "vscode-webview://1a2b3c",
    "vscode-file://vscode-app",
]


async def preflight(lab: FrontLab, origin: str, path: str = "/api/chat") -> aiohttp.ClientResponse:
    """What a browser sends before a POST with JSON and a token from another origin."""
    headers = {
        "Origin": origin,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type",
        "Sec-Fetch-Mode": "cors",
        "Sec-Fetch-Site": "cross-site",
    }
    async with lab.daemon.session.options(lab.url + path, headers=headers) as resp:
        await resp.read()
        return resp


async def test_a_preflight_from_each_default_origin_kind_is_answered(front):
    for origin in DEFAULT_ORIGIN_KINDS:
        resp = await preflight(front, origin)
        assert resp.status == 204, (origin, resp.status)
        h = resp.headers
        assert h["Access-Control-Allow-Origin"] == origin
        assert h["Access-Control-Allow-Methods"] == "GET,POST,PUT,PATCH,DELETE,HEAD,OPTIONS"
        allowed = h["Access-Control-Allow-Headers"].lower().split(",")
        assert {"authorization", "content-type", "x-stainless-retry-count", "openai-beta"} <= set(allowed)
        assert h["Access-Control-Max-Age"] == "43200"
        assert h.getall("Vary") == ["Origin", "Access-Control-Request-Method", "Access-Control-Request-Headers"]
    resp = await preflight(front, "http://localhost:3000", "/v1/chat/completions")
    assert resp.status == 204 and resp.headers["Access-Control-Allow-Origin"] == "http://localhost:3000"


async def cross_origin_chat(lab: FrontLab, origin: str, content: str, **headers) -> tuple[int, dict, dict]:
    sent = {"Origin": origin, "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "cors", **headers}
    async with lab.daemon.session.post(
        lab.url + "/api/chat",
        headers=sent,
        json={"model": CHAT_MODEL, "stream": False, "messages": [{"role": "user", "content": content}]},
    ) as resp:
        return resp.status, dict(resp.headers), await resp.json(content_type=None)


async def test_a_page_and_an_electron_app_on_another_origin_chat_and_may_read_the_answer(fakes, daemon_factory):
    lab = await start_lab(fakes, daemon_factory, token="s3cret")
    try:
        resp = await preflight(lab, "app://obsidian.md")  # no token in a preflight
        assert resp.status == 204
        for origin in ("http://localhost:3000", "app://obsidian.md"):
            status, headers, body = await cross_origin_chat(
                lab, origin, f"from {origin}", Authorization="Bearer s3cret"
            )
            assert status == 200, body
            assert body["message"]["content"] and headers["Access-Control-Allow-Origin"] == origin
            assert headers["Vary"] == "Origin"
        status, headers, body = await cross_origin_chat(lab, "http://localhost:3000", "no token")
        assert status == 401 and headers["Access-Control-Allow-Origin"] == "http://localhost:3000"  # readable
        # A stream's headers go out first: they name the origin too.
        async with lab.daemon.session.post(
            lab.url + "/api/chat",
            headers={"Origin": "app://obsidian.md", "Authorization": "Bearer s3cret"},
            json={"model": CHAT_MODEL, "messages": [{"role": "user", "content": "streamed"}]},
        ) as resp:
            assert resp.status == 200 and resp.headers["Access-Control-Allow-Origin"] == "app://obsidian.md"
            assert json.loads((await resp.read()).splitlines()[-1])["done"] is True
        # The router's own API still refuses a cross-site write from the same origin.
        async with lab.daemon.session.post(
            lab.daemon.url + "/api/jobs",
            json={"kind": "task", "prompt": "x"},
            headers={
                "Origin": "http://localhost:3000",
                "Sec-Fetch-Site": "cross-site",
                "Authorization": "Bearer s3cret",
            },
        ) as resp:
            assert resp.status == 403 and "cross-site request refused" in await resp.text()
            assert "Access-Control-Allow-Origin" not in resp.headers
    finally:
        await lab.close()


async def test_an_origin_not_allowed_is_refused_and_a_configured_one_is_served(fakes, daemon_factory):
    lab = await start_lab(
        fakes, daemon_factory, front={"origins": ["https://chat.example.com", "https://*.notes.example"]}
    )
    try:
        for origin in ("http://evil.example", "null", "http://localhost.evil.example", "chrome-extension://abc"):
            resp = await preflight(lab, origin)
            assert resp.status == 403 and "Access-Control-Allow-Origin" not in resp.headers, origin
            status, headers, body = await cross_origin_chat(lab, origin, f"planted by {origin}")
            assert status == 403 and "Access-Control-Allow-Origin" not in headers, origin
            assert f"origin '{origin}' is not allowed" in body["error"] and "[front] origins" in body["error"]
        assert await lab.jobs() == []
        for origin in ("https://chat.example.com", "https://work.notes.example"):
            resp = await preflight(lab, origin)
            assert resp.status == 204 and resp.headers["Access-Control-Allow-Origin"] == origin
            status, headers, body = await cross_origin_chat(lab, origin, f"from {origin}")
            assert status == 200 and headers["Access-Control-Allow-Origin"] == origin, body
        # Same origin (a page the front door's own address serves) is not a CORS request.
        status, headers, _ = await cross_origin_chat(lab, lab.url, "same origin")
        assert status == 200 and "Access-Control-Allow-Origin" not in headers
    finally:
        await lab.close()


# -- host names ---------------------------------------------------------------------------------


async def status_for_host(session: aiohttp.ClientSession, url: str, host: str) -> tuple[int, str]:
    async with session.get(url, headers={"Host": host}) as resp:
        return resp.status, await resp.text()


async def test_the_names_a_client_reaches_this_machine_by_are_answered_on_both_listeners(
    fakes, daemon_factory, tmp_path
):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tailscale = bin_dir / "tailscale"
    tailscale.write_text(FAKE_TAILSCALE)
    tailscale.chmod(tailscale.stat().st_mode | stat.S_IEXEC)
    lab = await start_lab(fakes, daemon_factory, env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
    try:
        session = lab.daemon.session
        port = lab.url.rsplit(":", 1)[1]
        names = [
            "host.docker.internal",
            "192.168.1.20",
            "10.0.0.7",
            "[fd12:3456::1]",
            "foo.local",
            "app.localhost",
            socket.gethostname(),
            MAGIC_DNS,
            MAGIC_DNS.split(".")[0],
            TAILNET_IP,
            "[::ffff:127.0.0.1]",
        ]
        for name in names:
            for host in (name, f"{name}:{port}"):
                status, text = await status_for_host(session, lab.url + "/api/tags", host)
                assert status == 200 and CHAT_MODEL in text, (host, status, text[:200])
                status, text = await status_for_host(session, lab.daemon.url + "/api/nodes", host)
                assert status == 200 and "node-1" in text, (host, status, text[:200])
        for host in (
            "evil.example",
            f"evil.example:{port}",
            "local.evil.example",
            "host.docker.internal.evil.example",
            "8.8.8.8",
            "gpu-box.other.ts.net",
        ):
            for url in (lab.url + "/api/tags", lab.daemon.url + "/api/nodes"):
                status, text = await status_for_host(session, url, host)
                assert status == 421 and "is not one of this router's names" in text, (url, host, status)
    finally:
        await lab.close()


# -- config ---------------------------------------------------------------------------------------


def with_front(front) -> dict:
    return {
        "front": front,
        "node": [{"name": "n1", "url": "http://n1:11434", "rank": 1, "roles": ["task"], "model": "m"}],
    }


def test_the_front_table_is_read_in_the_form_it_is_compared_in(tmp_path):
    settings = parse_config(
        with_front(
            {"max_request_bytes": 8 << 20, "origins": [" HTTPS://Chat.Example.com ", "*", "chrome-extension://*"]}
        ),
        tmp_path,
    )
    assert settings.front_max_request_bytes == 8 << 20
    assert settings.front_origins == ("https://chat.example.com", "*", "chrome-extension://*")
    defaults = parse_config(with_front({}), tmp_path)
    assert defaults.front_max_request_bytes == 64 << 20 and defaults.front_origins == ()


BAD_FRONT = {
    "not a table": ("x", "front: expected a [front] table"),
    "unknown key": (
        {"origin": []},
        "front: unknown key 'origin' (known: keep_alive, max_batch_lines, max_keep_alive, max_request_bytes, model_aliases,"
        " origins, stalled_client_timeout)",
    ),
    "keep_alive not a duration": (
        {"keep_alive": "soon"},
        "front.keep_alive: expected a duration like '10m' or '30s', got 'soon'",
    ),
    "negative max_keep_alive": ({"max_keep_alive": -1}, "front.max_keep_alive: a duration cannot be negative, got -1"),
    "stalled_client_timeout 0": (
        {"stalled_client_timeout": "0s"},
        "front.stalled_client_timeout: must be more than 0, got '0s'",
    ),
    "too small": (
        {"max_request_bytes": 1000},
        "front.max_request_bytes: must be from 1048576 (1 MiB) to 1073741824 (1 GiB), got 1000",
    ),
    "not a number": ({"max_request_bytes": "64MB"}, "front.max_request_bytes: expected int, got '64MB'"),
    "a string": (
        {"origins": "https://a.example"},
        "front.origins: expected a list of origins like [\"https://chat.example.com\"], got 'https://a.example'",
    ),
    "not a string": ({"origins": [5]}, "front.origins[1]: expected an origin (a string), got 5"),
    "two stars": (
        {"origins": ["https://*.*.example"]},
        "front.origins[1]: only one '*' is allowed, got 'https://*.*.example'",
    ),
    "no scheme": (
        {"origins": ["chat.example.com"]},
        "front.origins[1]: expected an origin like "
        "'https://chat.example.com' (scheme and host, or a '*' wildcard), got 'chat.example.com'",
    ),
    "a path": (
        {"origins": ["https://chat.example.com/"]},
        "front.origins[1]: write the origin alone "
        "(scheme://host[:port]), without a path, got 'https://chat.example.com/'",
    ),
}


@pytest.mark.parametrize("name", list(BAD_FRONT))
def test_each_front_mistake_names_the_key(name, tmp_path):
    value, message = BAD_FRONT[name]
    with pytest.raises(ConfigError) as exc:
        parse_config(with_front(value), tmp_path)
    assert exc.value.message == message


# -- a real browser -------------------------------------------------------------------------------

CHAT_PAGE = """<!doctype html><meta charset="utf-8"><title>chat</title><script>
window.asked = (async () => {
  const front = new URLSearchParams(location.search).get('front');
  try {
    const resp = await fetch(front + '/api/chat', {method: 'POST', headers: {
      'Content-Type': 'application/json', 'Authorization': 'Bearer s3cret'},
      body: JSON.stringify({model: 'MODEL', stream: false, messages: [{role: 'user', content: location.origin}]})});
    return {status: resp.status, body: await resp.json()};
  } catch (err) {
    return {status: 0, body: String(err)};
  }
})();
</script>""".replace("MODEL", CHAT_MODEL)


@pytest.mark.browser
async def test_a_page_on_localhost_chats_in_chromium_and_another_site_cannot(fakes, daemon_factory):
    """The page's fetch sends a token, so Chromium asks first (a preflight), then posts and reads
    the answer; the same page on another site gets nothing, and no job is made."""
    from aiohttp import web
    from playwright.async_api import async_playwright
    from test_page import CHROMIUM_ARGS

    lab = await start_lab(fakes, daemon_factory, token="s3cret")
    app = web.Application()

    async def chat_page(request):
        return web.Response(text=CHAT_PAGE, content_type="text/html")

    app.router.add_get("/chat.html", chat_page)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    try:
        async with async_playwright() as p:
            browser = await p.chromium.launch(
                executable_path=chromium, args=[*CHROMIUM_ARGS, "--host-resolver-rules=MAP evil.test 127.0.0.1"]
            )
            try:
                page = await browser.new_page()
                await page.goto(f"http://localhost:{port}/chat.html?front={lab.url}")
                got = await page.evaluate("window.asked")
                assert got["status"] == 200 and got["body"]["message"]["content"], got
                evil = await browser.new_page()
                await evil.goto(f"http://evil.test:{port}/chat.html?front={lab.url}")
                got = await evil.evaluate("window.asked")
                assert got["status"] == 0 and "Failed to fetch" in got["body"], got
            finally:
                await browser.close()
        assert [j["prompt_excerpt"] for j in await all_jobs(lab)] == [f"http://localhost:{port}"]
    finally:
        await runner.cleanup()
        await lab.close()


async def all_jobs(lab: FrontLab) -> list[dict]:
    status, body = await lab.daemon.request("GET", "/api/jobs?limit=1000", headers={"Authorization": "Bearer s3cret"})
    assert status == 200, body
    return body["jobs"]
