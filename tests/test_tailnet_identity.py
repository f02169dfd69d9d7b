"""identity = "tailscale": a caller known without a token, as the local tailscaled's whois names the
connection's owner (a stand-in LocalAPI on a Unix socket answers its real JSON shape); tailscale
serve's Tailscale-User-Login header trusted only from loopback to a loopback listener."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import tomllib
from pathlib import Path
from unittest import mock

import aiohttp
import openai
import pytest
import tomli_w
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from conftest import eventually, free_port, node_table

from gpuq.config import ConfigError, Settings, parse_config

ALICE = {
    "ID": 1234567890,
    "LoginName": "alice@example.com",
    "DisplayName": "Alice Example",
    "ProfilePicURL": "https://example.com/alice.png",
}
BOB = {"ID": 2345678901, "LoginName": "bob@example.com", "DisplayName": "Bob Example"}
TAGGED = {"ID": 1, "LoginName": "tagged-devices", "DisplayName": "Tagged Devices"}  # what tailscaled names


def whois_reply(profile: dict, tags: list[str] | None = None, name: str = "laptop.tail1234.ts.net.") -> dict:
    """apitype.WhoIsResponse as tailscaled's serveWhoIsWithBackend writes it."""
    node = {
        "ID": 98765,
        "StableID": "nStable1CNTRL",
        "Name": name,
        "User": profile["ID"],
        "Key": "nodekey:0123456789abcdef",
        "Addresses": ["100.101.102.103/32", "fd7a:115c:a1e0::1/128"],
        "AllowedIPs": ["100.101.102.103/32", "fd7a:115c:a1e0::1/128"],
        "Online": True,
        "ComputedName": name.split(".")[0],
    }
    if tags:
        node["Tags"] = tags
    return {"Node": node, "UserProfile": profile, "CapMap": {"https://tailscale.com/cap/is-admin": None}}


class LocalAPI:
    """tailscaled's LocalAPI on a Unix socket, as far as whois goes: it refuses a Host other than
    local-tailscaled.sock (localapi.go ServeHTTP), answers 400 without addr and 404 "no match for
    IP:port" for an address no node owns."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.answer: dict | None = whois_reply(ALICE)  # None: no node owns any address
        self.asked: list[str] = []
        self.runner: web.AppRunner | None = None

    async def whois(self, request: web.Request) -> web.Response:
        if request.host != "local-tailscaled.sock":
            return web.Response(status=403, text="invalid localapi request\n")
        addr = request.query.get("addr")
        if not addr:
            return web.Response(status=400, text="missing 'addr' parameter\n")
        self.asked.append(addr)
        if self.answer is None:
            return web.Response(status=404, text="no match for IP:port\n")
        return web.json_response(self.answer)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/localapi/v0/whois", self.whois)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.UnixSite(self.runner, str(self.path)).start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


@pytest.fixture
async def localapi():
    short = Path(tempfile.mkdtemp(prefix="ts-"))  # a socket path must be short (108 bytes)
    api = LocalAPI(short / "tailscaled.sock")
    await api.start()
    yield api
    await api.stop()
    shutil.rmtree(short, ignore_errors=True)


async def tailnet_lab(fakes, daemon_factory, users: list[dict] | None = None, env: dict | None = None, **router):
    """A router with `router` keys and [[user]] tables `users`, started."""
    fake = await fakes("qwen3-coder:30b")
    d = await daemon_factory(
        [node_table("node-1", fake, 1, ["task", "critique"], "qwen3-coder:30b")], start=False, env=env, **router
    )
    data = tomllib.loads(d.config.read_text())
    if users:
        data["user"] = users
    d.config.write_text(tomli_w.dumps(data))
    await d.start()
    return d


async def whoami(d, headers: dict | None = None, session: aiohttp.ClientSession | None = None):
    async with (session or d.session).get(d.url + "/api/whoami", headers=headers or {}) as resp:
        return resp.status, await resp.json(content_type=None)


async def test_a_tailnet_caller_is_its_login_without_a_token(fakes, daemon_factory, localapi):
    d = await tailnet_lab(
        fakes,
        daemon_factory,
        [{"name": "alice@example.com", "role": "member"}],
        identity="tailscale",
        tailscale_socket=str(localapi.path),
        token="admin-token-1234",
    )
    async with aiohttp.ClientSession() as session:  # one connection, reused: its peer address asked once
        for _ in range(4):
            status, body = await whoami(d, session=session)
            assert status == 200, body
            assert body == {"name": "alice@example.com", "role": "member", "via": "tailscale"}
        async with session.post(d.url + "/api/jobs", json={"kind": "task", "prompt": "from the tailnet"}) as resp:
            assert resp.status == 201, await resp.text()
            job = (await resp.json())["jobs"][0]["id"]
        async with session.get(f"{d.url}/api/jobs/{job}") as resp:
            detail = await resp.json()
        assert detail["owner"] == "alice@example.com"  # the job is hers, and its events name her
        assert detail["events"][0]["actor"].startswith("alice@example.com (")
    # Asked as tailscale's client asks: IP:PORT of the connection's peer, over the socket.
    assert localapi.asked and all(a.startswith("127.0.0.1:") and a.rsplit(":", 1)[1].isdigit() for a in localapi.asked)
    assert len(localapi.asked) < 5  # cached per peer address, not asked per request
    # A token still works alongside (a script on a tagged server), and wins.
    status, body = await whoami(d, {"Authorization": "Bearer admin-token-1234"})
    assert body == {"name": "admin", "role": "admin", "via": "token"}
    # A wrong token is refused, not passed over for the tailnet's answer.
    status, body = await whoami(d, {"Authorization": "Bearer wrong-token-9999"})
    assert status == 401


async def test_default_role_admits_a_login_without_a_user(fakes, daemon_factory, localapi):
    localapi.answer = whois_reply(BOB)
    d = await tailnet_lab(
        fakes, daemon_factory, identity="tailscale", tailscale_socket=str(localapi.path), default_role="member"
    )
    status, body = await whoami(d)
    assert (status, body) == (200, {"name": "bob@example.com", "role": "member", "via": "tailscale"})


async def test_a_login_without_a_user_or_default_role_is_refused_by_name(fakes, daemon_factory, localapi):
    localapi.answer = whois_reply(BOB)
    d = await tailnet_lab(
        fakes,
        daemon_factory,
        [{"name": "alice@example.com"}],
        identity="tailscale",
        tailscale_socket=str(localapi.path),
    )
    status, body = await d.request("POST", "/api/jobs", {"kind": "task", "prompt": "x"})
    assert status == 403, body
    message = body["error"]["message"]
    assert "bob@example.com" in message and "[[user]]" in message and "default_role" in message
    assert (await d.request("GET", "/api/jobs"))[0] == 403


async def test_a_tagged_node_is_refused_naming_its_tags_and_may_use_a_token(fakes, daemon_factory, localapi):
    localapi.answer = whois_reply(TAGGED, tags=["tag:ci", "tag:gpu"], name="ci-runner.tail1234.ts.net.")
    d = await tailnet_lab(
        fakes,
        daemon_factory,
        [{"name": "ci", "token": "ci-token-12345678"}],
        identity="tailscale",
        tailscale_socket=str(localapi.path),
        default_role="member",
    )
    status, body = await d.request("GET", "/api/queue")
    assert status == 403, body
    message = body["error"]["message"]
    assert "tag:ci" in message and "tag:gpu" in message and "ci-runner" in message and "token" in message
    status, body = await whoami(d, {"Authorization": "Bearer ci-token-12345678"})
    assert body == {"name": "ci", "role": "member", "via": "token"}


async def test_no_tailnet_peer_and_no_token_is_401(fakes, daemon_factory, localapi):
    localapi.answer = None
    d = await tailnet_lab(
        fakes, daemon_factory, identity="tailscale", tailscale_socket=str(localapi.path), default_role="admin"
    )
    status, body = await d.request("GET", "/api/queue")
    assert status == 401 and "token" in body["error"]["message"]


async def test_tailscale_serve_header_is_trusted_from_loopback_on_a_loopback_listener(fakes, daemon_factory, localapi):
    localapi.answer = None  # serve proxies from 127.0.0.1: whois knows no node for it
    d = await tailnet_lab(
        fakes,
        daemon_factory,
        [{"name": "alice@example.com", "role": "admin"}],
        identity="tailscale",
        tailscale_socket=str(localapi.path),
    )
    status, body = await whoami(d, {"Tailscale-User-Login": "alice@example.com"})
    assert (status, body) == (200, {"name": "alice@example.com", "role": "admin", "via": "serve"})
    status, body = await whoami(d, {"Tailscale-User-Login": "mallory@example.com"})
    assert status == 403 and "mallory@example.com" in body["error"]["message"]


async def test_tailscale_serve_header_is_ignored_when_identity_is_token(fakes, daemon_factory):
    d = await tailnet_lab(
        fakes,
        daemon_factory,
        [{"name": "alice@example.com", "token": "alice-token-1234"}, {"name": "bob", "token": "bob-token-12345678"}],
    )
    spoof = {"Tailscale-User-Login": "alice@example.com"}
    for _ in range(2):
        status, body = await whoami(d, spoof)
        assert status == 401, body
    status, body = await whoami(d, {**spoof, "Authorization": "Bearer bob-token-12345678"})
    assert body == {"name": "bob", "role": "member", "via": "token"}
    text = await eventually(
        lambda: "ignored a Tailscale-User-Login" in d.log.read_text() and d.log.read_text(),
        what="the ignored header to be logged",
    )
    assert text.count("ignored a Tailscale-User-Login") == 1  # once, not per request


def request_on(listen: str, peer: str, sock: str, identity: str = "tailscale"):
    """A request as aiohttp hands it over: from `peer`, to `sock`, on a listener bound to `listen`."""
    settings = Settings(listen=listen, identity=identity)
    transport = mock.Mock()
    transport.get_extra_info.side_effect = lambda key, default=None: {
        "peername": (peer, 50000),
        "sockname": (sock, settings.port),
    }.get(key, default)
    request = make_mocked_request(
        "GET", "/api/whoami", headers={"Tailscale-User-Login": "alice@example.com"}, transport=transport
    )
    return settings, request


@pytest.mark.parametrize(
    "listen, peer, sock, identity, trusted",
    [
        ("127.0.0.1:8765", "127.0.0.1", "127.0.0.1", "tailscale", True),
        ("[::1]:8765", "::1", "::1", "tailscale", True),
        ("localhost:8765", "127.0.0.1", "127.0.0.1", "tailscale", True),
        # a listener on every address: a loopback request may be anyone's on this machine, but serve's
        # target is loopback; one on the tailnet address: the header came from a peer, not serve
        ("0.0.0.0:8765", "127.0.0.1", "127.0.0.1", "tailscale", False),
        ("100.101.102.103:8765", "100.101.102.104", "100.101.102.103", "tailscale", False),
        ("0.0.0.0:8765", "100.101.102.104", "100.101.102.103", "tailscale", False),
        ("127.0.0.1:8765", "127.0.0.1", "127.0.0.1", "token", False),
    ],
)
def test_serve_header_trust_needs_loopback_both_ends_and_tailscale_identity(listen, peer, sock, identity, trusted):
    from gpuq.access.tailnet import serve_trusted  # here: the daemon tests fail on their own without it

    settings, request = request_on(listen, peer, sock, identity)
    assert serve_trusted(settings, request) is trusted


async def test_without_the_socket_the_tailscale_cli_is_asked(fakes, daemon_factory, tmp_path):
    """macOS's app has no tailscaled.sock: `tailscale whois --json IP:PORT` prints the same object."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "tailscale"
    (tmp_path / "reply.json").write_text(json.dumps(whois_reply(ALICE), indent=2))
    script.write_text(f"""#!{sys.executable}
import sys
args = sys.argv[1:]
if args[:2] != ["whois", "--json"]:
    sys.exit("unsupported: " + " ".join(args))
open({str(tmp_path / "asked")!r}, "a").write(args[-1] + "\\n")
print(open({str(tmp_path / "reply.json")!r}).read())
""")
    script.chmod(0o755)
    d = await tailnet_lab(
        fakes,
        daemon_factory,
        [{"name": "alice@example.com"}],
        identity="tailscale",
        tailscale_socket=str(tmp_path / "absent.sock"),
        env={"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"},
    )
    status, body = await whoami(d)
    assert (status, body) == (200, {"name": "alice@example.com", "role": "member", "via": "tailscale"})
    assert (tmp_path / "asked").read_text().startswith("127.0.0.1:")


async def test_an_unreachable_tailscaled_is_401_naming_the_socket(fakes, daemon_factory, tmp_path):
    absent = tmp_path / "absent.sock"
    d = await tailnet_lab(
        fakes,
        daemon_factory,
        identity="tailscale",
        tailscale_socket=str(absent),
        default_role="member",
        env={"PATH": str(tmp_path)},
    )  # no `tailscale` command
    status, body = await d.request("GET", "/api/queue")
    assert status == 401 and str(absent) in body["error"]["message"]


def test_tailscale_socket_is_a_router_key_relative_to_the_config(tmp_path):
    node = {"name": "node-1", "url": "http://127.0.0.1:11434", "rank": 1, "roles": ["task"], "model": "m"}
    default = parse_config({"node": [node]}, tmp_path)
    assert str(default.tailscale_socket) == "/var/run/tailscale/tailscaled.sock"
    settings = parse_config(
        {"router": {"identity": "tailscale", "tailscale_socket": "run/ts.sock"}, "node": [node]}, tmp_path
    )
    assert settings.tailscale_socket == tmp_path / "run" / "ts.sock"
    with pytest.raises(ConfigError, match="tailscale_socket"):
        parse_config({"router": {"tailscale_socket": 5}, "node": [node]}, tmp_path)


async def test_whois_answers_are_kept_per_tailnet_address_and_per_loopback_port(localapi, monkeypatch):
    from gpuq.access import tailnet as tailnet_identity

    now = [1000.0]
    whois = tailnet_identity.Whois(clock=lambda: now[0])
    for port in (40001, 40002, 40003):  # one tailnet machine's connections: asked once
        owner = await whois.owner(localapi.path, f"100.101.102.103:{port}")
        assert owner.login == "alice@example.com" and owner.node == "laptop"
    for port in (40001, 40002):  # tailscaled's proxy on loopback: each port may be another peer
        await whois.owner(localapi.path, f"127.0.0.1:{port}")
    assert localapi.asked == ["100.101.102.103:40001", "127.0.0.1:40001", "127.0.0.1:40002"]
    now[0] += tailnet_identity.CACHE_TTL_S + 1  # kept briefly: asked again after
    await whois.owner(localapi.path, "100.101.102.103:40009")
    assert localapi.asked[-1] == "100.101.102.103:40009"
    monkeypatch.setattr(tailnet_identity, "CACHE_SIZE", 2)  # bounded: the oldest go first
    for i in range(5):
        await whois.owner(localapi.path, f"100.64.0.{i}:1")
    assert len(whois.cache) == 2


async def test_the_front_doors_clients_may_send_any_key_on_a_tailnet(fakes, daemon_factory, localapi):
    """The OpenAI SDK will not run without an api_key, and Claude Code always sends one: at the
    front door a key that is no user's token says nothing, and the tailnet names the caller (the
    router's own API still refuses a wrong token)."""
    port = free_port()
    d = await tailnet_lab(
        fakes,
        daemon_factory,
        [{"name": "alice@example.com", "role": "member"}],
        identity="tailscale",
        tailscale_socket=str(localapi.path),
        token="admin-token-1234",
        ollama_listen=f"127.0.0.1:{port}",
    )
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="ollama", max_retries=0)
    try:
        reply = await client.chat.completions.create(
            model="qwen3-coder:30b", messages=[{"role": "user", "content": "from my editor"}]
        )
        assert reply.choices[0].message.content
    finally:
        await client.close()
    jobs = (await d.request("GET", "/api/jobs?limit=5", headers={"Authorization": "Bearer admin-token-1234"}))[1]
    assert [(j["owner"], j["endpoint"]) for j in jobs["jobs"]] == [("alice@example.com", "/v1/chat/completions")]
    status, _ = await whoami(d, {"Authorization": "Bearer ollama"})
    assert status == 401
