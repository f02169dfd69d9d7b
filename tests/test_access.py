"""Access control: the token, cross-site refusals, security headers, loopback by default."""

from __future__ import annotations

from conftest import node_table

from gpuq.config import Settings


async def token_lab(fakes, daemon_factory, env=None, **router):
    fake = await fakes("qwen3-coder:30b")
    return await daemon_factory(
        [node_table("node-1", fake, 1, ["task", "critique"], "qwen3-coder:30b")], env=env, **router
    )


async def test_token_is_required_on_the_api_and_compared_exactly(fakes, daemon_factory):
    d = await token_lab(fakes, daemon_factory, token="s3cret-token")
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret-token"}):
        status, body = await d.request("GET", "/api/queue", headers=headers)
        assert status == 401 and "token" in body["error"]["message"]
    status, body = await d.request("POST", "/api/jobs", {"kind": "task", "prompt": "x"})
    assert status == 401
    assert (await d.request("GET", "/api/jobs"))[0] == 401
    ok = {"Authorization": "Bearer s3cret-token"}
    status, body = await d.request("POST", "/api/jobs", {"kind": "task", "prompt": "secret prompt"}, headers=ok)
    assert status == 201
    # /health stays open and reveals no prompts.
    status, health = await d.request("GET", "/health")
    assert status in (200, 503) and "secret prompt" not in str(health)
    # The page's HTML loads without the token, so it can ask for it.
    assert (await d.request("GET", "/"))[0] == 200
    # EventSource cannot send headers: /api/events takes ?token=.
    async with d.session.get(f"{d.url}/api/events?token=s3cret-token") as resp:
        assert resp.status == 200
    async with d.session.get(f"{d.url}/api/events?token=nope") as resp:
        assert resp.status == 401
    assert "s3cret-token" not in d.log.read_text()  # no token in the router's log


async def test_the_bearer_scheme_is_case_insensitive_on_both_doors(fakes, daemon_factory):
    """RFC 7235: the scheme is case-insensitive; some clients send `bearer`."""
    from aiohttp.test_utils import make_mocked_request

    from gpuq.access.tokens import token_of, tokens_given

    d = await token_lab(fakes, daemon_factory, token="s3cret-token")
    for scheme in ("bearer", "BEARER", "Bearer"):
        ok = {"Authorization": f"{scheme} s3cret-token"}
        assert (await d.request("GET", "/api/queue", headers=ok))[0] == 200, scheme
    assert (await d.request("GET", "/api/queue", headers={"Authorization": "Basic s3cret-token"}))[0] == 401
    # The front door reads the same header the same way (and x-api-key on Anthropic's routes).
    request = make_mocked_request("POST", "/v1/messages", headers={"Authorization": "bearer  tok "})
    assert token_of(request) == "tok" and tokens_given(request, anthropic=True) == ["tok"]
    assert token_of(make_mocked_request("GET", "/api/tags", headers={"Authorization": "bearer"})) is None


async def test_cli_sends_the_token_from_the_environment(fakes, daemon_factory):
    d = await token_lab(fakes, daemon_factory, token="tok-123")
    res = await d.cli("queue")
    assert res.code == 1 and res.err.startswith("error 401 missing or wrong token")
    d.env["GPUQ_TOKEN"] = "tok-123"
    res = await d.cli("task", "hello")
    assert res.code == 0, res.err


async def test_token_from_environment_protects_the_daemon(fakes, daemon_factory):
    d = await token_lab(fakes, daemon_factory, env={"GPUQ_TOKEN": "from-env"})
    assert (await d.request("GET", "/api/queue"))[0] == 401
    assert (await d.request("GET", "/api/queue", headers={"Authorization": "Bearer from-env"}))[0] == 200


async def test_cross_site_state_changes_are_refused(lab):
    [job] = await lab.submit("task", "mine", node="node-3")
    cases = [
        {"Origin": "https://evil.example"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Origin": "null"},
        {"Sec-Fetch-Site": "same-site"},
    ]
    for headers in cases:
        status, body = await lab.request("DELETE", f"/api/jobs/{job['id']}", headers=headers)
        assert status == 403 and "cross-site request refused" in body["error"]["message"], headers
        status, _ = await lab.request("POST", "/api/jobs", {"kind": "task", "prompt": "x"}, headers=headers)
        assert status == 403
    assert (await lab.job(job["id"]))["state"] != "cancelled"
    host = lab.url.split("//")[1]
    same = {"Origin": lab.url, "Sec-Fetch-Site": "same-origin", "Host": host}
    status, _ = await lab.request("POST", "/api/jobs", {"kind": "task", "prompt": "y"}, headers=same)
    assert status == 201
    # Reads from anywhere are harmless to the queue (and CORS keeps their answers from other sites).
    assert (await lab.request("GET", "/api/queue", headers={"Origin": "https://evil.example"}))[0] == 200


async def test_security_headers_on_every_response(lab):
    for path in ("/", "/health", "/api/queue", "/api/jobs/1-zz"):
        async with lab.session.get(lab.url + path) as resp:
            csp = resp.headers["Content-Security-Policy"]
            assert "script-src 'self'" in csp and "default-src 'none'" in csp
            assert resp.headers["X-Content-Type-Options"] == "nosniff"
            assert resp.headers["Referrer-Policy"] == "no-referrer"


def test_listens_on_loopback_by_default():
    assert Settings().host == "127.0.0.1"


async def test_an_empty_token_from_the_environment_stops_the_router_from_starting(fakes, daemon_factory):
    # The variable is set, so a token was meant: ignoring it would serve the queue to anyone.
    d = await token_lab(fakes, daemon_factory, env={"GPUQ_TOKEN": ""}, start=False)
    res = await d.cli("serve", "--config", str(d.config), timeout=20)
    assert res.code == 78
    assert res.err.strip() == "gpuq: config error: $GPUQ_TOKEN: must not be empty (leave it out for no token)"
