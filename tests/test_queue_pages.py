"""/api/queue pages one node's waiting jobs (issue 28): `node` and `offset` give a column's jobs
from the offset-th on, with the count of all and start estimates that count the jobs ahead of
the page, so the queue page fetches what is scrolled into view, not a 10,000-job queue; and
`columns` lists the waiting jobs of the first nodes only (the columns in view). A bad value is
refused, named."""

from __future__ import annotations

from test_page import busy, head

from gpuq.jobs import parse_iso


async def test_a_node_s_waiting_jobs_page_by_page(lab):
    lab.fakes["node-3"].script.token_delay_s = 0.05  # a run of about 1.5 s: the estimates' unit
    lab.fakes["node-3"].script.tokens = 30
    timed = (await lab.submit("task", "one run to time the node by", node="node-3"))[0]["id"]
    await lab.wait_state(timed, "done")
    busy(lab.fakes["node-3"])
    running = await head(lab, "node-3")
    ids = [(await lab.submit("task", f"job {i}", node="node-3"))[0]["id"] for i in range(12)]

    whole = await lab.get("/api/queue?limit=100")
    column = next(n for n in whole["nodes"] if n["name"] == "node-3")
    assert [j["id"] for j in column["queued"]] == ids

    page = await lab.get("/api/queue?node=node-3&offset=5&limit=4")
    assert page["offset"] == 5
    assert [n["name"] for n in page["nodes"]] == ["node-3"], "one node's column only"
    (node,) = page["nodes"]
    assert [j["id"] for j in node["queued"]] == ids[5:9]
    assert node["queued_count"] == 12 and node["running"]["id"] == running
    # Each job's start estimate is the one the whole queue gives it (the jobs ahead counted).
    by_id = {j["id"]: j for j in column["queued"]}
    for j in node["queued"]:
        whole_j = by_id[j["id"]]
        assert j["eta_reason"] == whole_j["eta_reason"], (j, whole_j)
        assert j["eta_start"] and whole_j["eta_start"], (j, whole_j)
        # Read a moment apart: the same start, give or take (not the head's: five runs ahead).
        assert abs(parse_iso(j["eta_start"]) - parse_iso(whole_j["eta_start"])) < 3, (j, whole_j)

    assert parse_iso(node["queued"][0]["eta_start"]) > parse_iso(column["queued"][0]["eta_start"]) + 5
    tail = (await lab.get("/api/queue?node=node-3&offset=10&limit=100"))["nodes"][0]
    assert [j["id"] for j in tail["queued"]] == ids[10:]
    past = (await lab.get("/api/queue?node=node-3&offset=50"))["nodes"][0]
    assert past["queued"] == [] and past["queued_count"] == 12
    head_page = (await lab.get("/api/queue?node=node-3&limit=3"))["nodes"][0]
    assert [j["id"] for j in head_page["queued"]] == ids[:3]


async def test_the_waiting_jobs_of_the_first_columns_only(lab):
    """`columns=`: the waiting jobs of the first nodes (rank order) only, as a page reads the
    columns in view; the others keep their running job and count, their list empty."""
    ids = {}
    for node in ("node-1", "node-3"):
        busy(lab.fakes[node])
        ids[node] = [
            await head(lab, node),
            *[(await lab.submit("task", f"{node} job {i}", node=node))[0]["id"] for i in range(3)],
        ]
    whole = await lab.get("/api/queue?limit=10")
    names = [n["name"] for n in whole["nodes"]]
    assert names[0] == "node-1" and "node-3" in names[1:], names
    first = await lab.get("/api/queue?limit=10&columns=1")
    assert [n["name"] for n in first["nodes"]] == names and first["queue_depth"] == whole["queue_depth"] == 6
    by_name = {n["name"]: n for n in first["nodes"]}
    assert [j["id"] for j in by_name["node-1"]["queued"]] == ids["node-1"][1:]
    whole_1 = next(n for n in whole["nodes"] if n["name"] == "node-1")
    assert [j["eta_reason"] for j in by_name["node-1"]["queued"]] == [j["eta_reason"] for j in whole_1["queued"]]
    assert by_name["node-3"]["queued"] == [] and by_name["node-3"]["queued_count"] == 3
    assert by_name["node-3"]["running"]["id"] == ids["node-3"][0]
    none = await lab.get("/api/queue?limit=10&columns=0")
    assert all(n["queued"] == [] for n in none["nodes"]) and none["queue_depth"] == 6
    assert sum(1 for n in none["nodes"] if n["running"]) == 2


async def test_a_bad_page_is_refused_named(lab):
    for query, status, words in [
        ("node=node-3&offset=-1", 400, "'offset'"),
        ("node=node-3&offset=abc", 400, "'offset'"),
        ("node=node-3&offset=1.5", 400, "'offset'"),
        ("offset=10", 400, "needs 'node'"),
        ("node=node-9&offset=0", 422, "unknown node 'node-9'"),
        ("columns=-1", 400, "'columns'"),
        ("columns=x", 400, "'columns'"),
    ]:
        status_got, body = await lab.request("GET", f"/api/queue?{query}")
        assert status_got == status, (query, status_got, body)
        assert words in body["error"]["message"], (query, body)
