"""The configuration reference: every key the parser accepts is declared once (config.KEYS),
with a doc and a default that is the code's own; the docs page is rendered from that declaration."""

import importlib.util
import re
import tomllib
from dataclasses import fields
from pathlib import Path

import pytest

from gpuq import reload
from gpuq.config import KEYS, ConfigError, NodeConfig, Settings, UserConfig, load_config, parse_config, parse_duration

ROOT = Path(__file__).resolve().parent.parent
NODE = {"name": "n", "url": "http://n:11434", "rank": 1, "roles": ["task"], "model": "m"}


def declared(section: str) -> set[str]:
    return {k.name for k in KEYS if k.section == section}


def test_each_key_is_declared_once_with_a_doc():
    names = [(k.section, k.name) for k in KEYS]
    assert len(names) == len(set(names))
    assert all(k.section in ("router", "front", "retention", "backup", "storage", "node", "user") for k in KEYS)
    assert all(k.doc.strip() and (k.default is not None or k.shown) for k in KEYS)
    owners = {
        "router": Settings,
        "front": Settings,
        "retention": Settings,
        "backup": Settings,
        "storage": Settings,
        "node": NodeConfig,
        "user": UserConfig,
    }
    for k in KEYS:
        assert k.attr in {f.name for f in fields(owners[k.section])}, k


def test_every_key_of_the_example_is_declared():
    text = (ROOT / "gpuq.toml.example").read_text()
    data = tomllib.loads(text)
    assert set(data["router"]) <= declared("router")
    assert set(data["front"]) <= declared("front")
    assert all(set(n) <= declared("node") for n in data["node"])
    # and every key it shows in a comment ("# token = ...") too
    commented = set(re.findall(r"(?m)^# ([a-z_]+) = ", text))
    assert set(data["retention"]) <= declared("retention")
    every = declared("router") | declared("front") | declared("retention") | declared("node") | declared("user")
    assert commented and commented <= every


@pytest.mark.parametrize("section", ["router", "front", "retention", "node", "user"])
def test_the_parser_accepts_exactly_the_declared_keys(section, tmp_path):
    """Every declared key is accepted; any other is refused with the message of before, which
    lists the known keys: so a key the parser takes without a declaration fails here."""
    data = {"node": [dict(NODE)]}
    table = {
        "router": data.setdefault("router", {}),
        "front": data.setdefault("front", {}),
        "retention": data.setdefault("retention", {}),
        "node": data["node"][0],
    }.get(section)
    if section == "user":
        table = {"name": "alice"}
        data["user"] = [table]
    table["surely_not_a_key"] = 1
    with pytest.raises(ConfigError) as err:
        parse_config(data, tmp_path)
    known = re.search(r"unknown key 'surely_not_a_key' \(known: (.*)\)$", err.value.message)
    assert known, err.value.message
    assert set(known.group(1).split(", ")) == declared(section)


def test_a_config_with_every_key_parses(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUQ_TEST_ALICE", "alice-token")
    router = {k.name: k.default for k in KEYS if k.section == "router" and k.default is not None}
    router |= {
        "public_url": "http://127.0.0.1:8750",
        "token": "t0k3n",
        "default_role": "member",
        "ollama_listen": "127.0.0.1:11435",
        "job_timeout": "1h",
        "max_database_bytes": 1 << 30,
        "critique_template": "Review:\n{subject}",
        "fair_share": True,
        "alert_url": "https://ntfy.sh/x",
        "alert_token": "tk",
    }
    front = {k.name: k.default for k in KEYS if k.section == "front"}
    node = dict(
        NODE, max_runtime="8h", think=False, options={"num_ctx": 4096}, unload="when-idle", max_output_bytes=1 << 20
    )
    users = [
        {
            "name": "alice",
            "token_env": "GPUQ_TEST_ALICE",
            "role": "admin",
            "lanes": ["batch"],
            "max_waiting": 5,
            "max_running": 1,
        },
        {"name": "bob", "token": "bob-token"},
    ]
    retention = {k.name: k.default for k in KEYS if k.section == "retention" and k.default is not None}
    retention |= {"archive": "archive", "delete_after": "off"}
    data = {"router": router, "front": front, "retention": retention, "node": [node], "user": users}
    assert set(router) == declared("router") and set(front) == declared("front")
    assert set(retention) == declared("retention")
    assert set(node) == declared("node") and set(users[0]) | set(users[1]) == declared("user")
    settings = parse_config(data, tmp_path)
    assert settings.ollama_listen == "127.0.0.1:11435" and settings.nodes[0].unload == "when-idle"
    assert settings.retention_archive == tmp_path / "archive" and settings.retention_delete_after_s is None


def test_the_declared_defaults_are_the_code_s(tmp_path):
    """A key set to its declared default parses to what leaving it out gives."""
    blank = parse_config({"node": [NODE]}, tmp_path)
    for k in KEYS:
        if k.section not in ("router", "front", "retention") or k.default is None:
            continue
        table = {k.name: k.default} | ({"alert_url": "https://ntfy.sh/x"} if k.name == "alert_format" else {})
        got = parse_config({k.section: table, "node": [NODE]}, tmp_path)
        assert getattr(got, k.attr) == getattr(blank, k.attr), k.name
        if k.duration:
            assert parse_duration(k.default, k.name) == getattr(Settings(), k.attr)
        if k.section == "retention":
            assert getattr(got, k.attr) == getattr(Settings(), k.attr), k.name
    user = parse_config({"node": [NODE], "user": [{"name": "u"}]}, tmp_path).users[0]
    for k in KEYS:
        if k.section == "user" and k.default is not None:
            assert getattr(user, k.attr) == (tuple(k.default) if isinstance(k.default, list) else k.default)


def test_reload_reads_the_declaration():
    assert set(reload.RESTART) == {k.attr for k in KEYS if k.restart}
    assert all(k.section in ("router", "front") for k in KEYS if k.restart)
    # What the front door reads once at its start needs a restart (create_front_app, access_middleware).
    assert {"front_origins", "front_max_request_bytes"} <= set(reload.RESTART)
    assert reload.key_of("stall_timeout_s") == "stall_timeout" and reload.key_of("lease_s") == "lease"
    assert reload.key_of("retention_delete_after_s") == "retention.delete_after"


def test_the_reference_page_names_every_key():
    spec = importlib.util.spec_from_file_location("config_reference", ROOT / "docs" / "hooks" / "config_reference.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    page = hook.render()
    for k in KEYS:
        assert f"| `{k.name}`" in page
    assert hook.MARKER in (ROOT / "docs" / "configuration.md").read_text()
    assert "| `origins` |" in page and "needs a restart" in page


def test_an_unknown_table_is_still_refused(tmp_path):
    with pytest.raises(
        ConfigError,
        match=r"unknown key 'routr' \(expected \[router\], \[front\], \[retention\], \[backup\], \[storage\], \[\[node\]\] "
        r"and \[\[user\]\] tables\)",
    ):
        parse_config({"routr": {}}, tmp_path)
    with pytest.raises(ConfigError):
        load_config(ROOT / "nonexistent.toml")


@pytest.mark.parametrize(
    ("value", "seconds"), [("30d", 30 * 86400.0), ("12h", 43200.0), ("off", None), ("OFF", None), (3600, 3600.0)]
)
def test_a_retention_period_is_days_hours_or_off(value, seconds, tmp_path):
    got = parse_config({"retention": {"delete_after": value}, "node": [NODE]}, tmp_path)
    assert got.retention_delete_after_s == seconds


@pytest.mark.parametrize(
    ("table", "words"),
    [
        ({"prune_after": "0d"}, "retention.prune_after: must be more than 0"),
        ({"prune_after": "soon"}, 'retention.prune_after: expected a period like "30d"'),
        ({"delete_after": "4000d"}, "retention.delete_after: more than ten years"),
        ({"archive": ""}, 'retention.archive: expected a directory or "off"'),
        ({"batch": 0}, "retention.batch: must be from 1 to 10000"),
        ({"every": "10ms"}, "retention.every: must be at least 1s"),
        ({"compact": "200%"}, 'retention.compact: expected a percentage from "1%" to "90%", or "off", got \'200%\''),
        ({"compact": 0.25}, 'retention.compact: expected a percentage from "1%" to "90%", or "off", got 0.25'),
        ({"compact": "a lot%"}, "retention.compact: expected a percentage"),
    ],
)
def test_a_wrong_retention_setting_is_named(table, words, tmp_path):
    with pytest.raises(ConfigError, match=re.escape(words)):
        parse_config({"retention": table, "node": [NODE]}, tmp_path)


def test_compaction_is_a_share_of_the_file_or_off(tmp_path):
    assert parse_config({"node": [NODE]}, tmp_path).retention_compact_share == 0.1
    assert parse_config({"retention": {"compact": "10%"}, "node": [NODE]}, tmp_path).retention_compact_share == 0.1
    assert parse_config({"retention": {"compact": "Off"}, "node": [NODE]}, tmp_path).retention_compact_share is None


def test_the_archive_is_beside_the_database_unless_off(tmp_path):
    got = parse_config({"router": {"database": "data/q.db"}, "node": [NODE]}, tmp_path)
    assert got.retention_archive == tmp_path / "data" / "gpuq-archive"
    off = parse_config({"retention": {"archive": "off"}, "node": [NODE]}, tmp_path)
    assert off.retention_archive is None
