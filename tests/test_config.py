"""Config: the example parses; each mistake names its key."""

import re
import tomllib
from pathlib import Path

import pytest

from gpuq.config import ConfigError, load_config, parse_config, parse_duration, starter_config

ROOT = Path(__file__).resolve().parent.parent


def base(**router):
    return {
        "router": router,
        "node": [
            {"name": "node-1", "url": "http://node-1:11434", "rank": 1, "roles": ["task", "critique"], "model": "m:1"},
            {"name": "node-2", "url": "http://node-2:11434", "rank": 2, "roles": ["critique"], "model": "m:2"},
        ],
    }


def test_example_and_starter_configs_parse(tmp_path):
    example = load_config(ROOT / "gpuq.toml.example")
    assert [n.name for n in example.nodes] == ["node-1", "node-2", "node-3"]
    assert example.stale_after_s == 600
    starter = parse_config(tomllib.loads(starter_config()), tmp_path)
    assert starter.listen == "127.0.0.1:8750"
    assert starter.database == (tmp_path / "gpuq.db").resolve()
    # gpuq init's file opens the front door on loopback and says how to set a token, in comments
    assert starter.ollama_listen == "127.0.0.1:11435"
    text = starter_config()
    assert "# token = " in text and "secrets.token_urlsafe" in text
    assert sum(line.startswith("#") for line in text.splitlines()) >= 15


def test_database_is_relative_to_the_config_file(tmp_path):
    cfg = tmp_path / "sub" / "gpuq.toml"
    cfg.parent.mkdir()
    cfg.write_text(
        '[router]\ndatabase = "q.db"\n[[node]]\nname="a"\nurl="http://a:1"\nrank=1\nroles=["task"]\nmodel="m"\n'
    )
    assert load_config(cfg).database == (tmp_path / "sub" / "q.db").resolve()


def test_connection_settings_have_defaults_and_can_be_set(tmp_path):
    default = parse_config(base(), tmp_path)
    assert (default.header_timeout_s, default.keepalive_timeout_s, default.max_connections) == (10, 75, 1000)
    custom = parse_config(base(header_timeout="2s", keepalive_timeout="5m", max_connections=200), tmp_path)
    assert (custom.header_timeout_s, custom.keepalive_timeout_s, custom.max_connections) == (2, 300, 200)


def test_byte_limits_on_a_nodes_replies_have_defaults_and_a_node_may_set_its_own_output_cap(tmp_path):
    default = parse_config(base(), tmp_path)
    assert (default.max_output_bytes, default.max_reply_bytes) == (8 << 20, 16 << 20)
    assert [default.max_output_for(n) for n in default.nodes] == [8 << 20, 8 << 20]
    data = base(max_output_bytes=1 << 20, max_reply_bytes=1 << 20)
    data["node"][1]["max_output_bytes"] = 65536
    custom = parse_config(data, tmp_path)
    assert [custom.max_output_for(n) for n in custom.nodes] == [1 << 20, 65536]
    assert custom.max_reply_bytes == 1 << 20


@pytest.mark.parametrize(
    "where,key,value,message",
    [
        ("router", "max_output_bytes", 10, "router.max_output_bytes: must be from 1024 to 1073741824 (1 GiB), got 10"),
        ("router", "max_output_bytes", "8MiB", "router.max_output_bytes: expected int, got '8MiB'"),
        (
            "router",
            "max_reply_bytes",
            1 << 31,
            f"router.max_reply_bytes: must be from 65536 to 1073741824 (1 GiB), got {1 << 31}",
        ),
        (
            "node",
            "max_output_bytes",
            0,
            "node 'node-1'.max_output_bytes: must be from 1024 to 1073741824 (1 GiB), got 0",
        ),
        ("node", "max_reply_bytes", 65536, "node[1]: unknown key 'max_reply_bytes' (known: max_output_bytes, "),
    ],
)
def test_byte_limits_out_of_range_name_the_key(tmp_path, where, key, value, message):
    data = base()
    (data["router"] if where == "router" else data["node"][0])[key] = value
    with pytest.raises(ConfigError) as exc:
        parse_config(data, tmp_path)
    assert str(exc.value).startswith(message)


def test_slot_settings_have_defaults_and_are_checked(tmp_path):
    default = parse_config(base(), tmp_path)
    assert (default.max_connections_per_peer, default.body_timeout_s, default.keepalive_lifetime_s) == (64, 60, 3600)
    custom = parse_config(base(max_connections_per_peer=8, body_timeout="5s", keepalive_lifetime="10m"), tmp_path)
    assert (custom.max_connections_per_peer, custom.body_timeout_s, custom.keepalive_lifetime_s) == (8, 5, 600)
    for bad, named in [
        ({"max_connections_per_peer": 0}, "router.max_connections_per_peer: must be from 1"),
        ({"body_timeout": "0s"}, "router.body_timeout: must be more than 0"),
        ({"keepalive_lifetime": 0}, "router.keepalive_lifetime: must be more than 0"),
    ]:
        with pytest.raises(ConfigError, match=named):
            parse_config(base(**bad), tmp_path)


@pytest.mark.parametrize(
    "text,seconds", [("10m", 600), ("30s", 30), ("1h30m", 5400), ("250ms", 0.25), (90, 90), (1.5, 1.5)]
)
def test_durations(text, seconds):
    assert parse_duration(text, "k") == seconds


@pytest.mark.parametrize(
    "mutate,key",
    [
        (lambda d: d["router"].update(lisen="x"), "unknown key 'lisen'"),
        (lambda d: d.update(routr={}), "unknown key 'routr'"),
        (lambda d: d["node"][0].pop("model"), "node 'node-1': missing required key 'model'"),
        (lambda d: d["node"][0].pop("name"), "node[1]: missing required key 'name'"),
        (lambda d: d["node"][1].update(name="node-1"), "node 'node-1'.name: duplicate node name"),
        (lambda d: d["node"][1].update(rank=1), "node 'node-2'.rank: rank 1 is already used by node 'node-1'"),
        (lambda d: d["node"][0].update(url="node-1:11434"), "node 'node-1'.url"),
        (lambda d: d["node"][0].update(url="http://h:99999"), "node 'node-1'.url"),
        (lambda d: d["router"].update(stale_after="ten minutes"), "router.stale_after"),
        (lambda d: d["router"].update(listen="8750"), "router.listen"),
        (lambda d: d["node"][0].update(rank="1"), "node 'node-1'.rank: expected int"),
        (lambda d: d["node"][0].update(roles=["gpu"]), "node 'node-1'.roles"),
        (lambda d: d["node"][0].update(colour="red"), "unknown key 'colour'"),
        (lambda d: d["router"].update(critique_template="no placeholder"), "router.critique_template"),
        (
            lambda d: d["router"].update(alert_url="ntfy.sh/gpu-lab"),
            "router.alert_url: expected an http:// or https:// URL",
        ),
        (
            lambda d: d["router"].update(alert_url="https://ntfy.sh/x", alert_format="sms"),
            "router.alert_format: expected 'json' or 'ntfy', got 'sms'",
        ),
        (lambda d: d["router"].update(alert_token="tk_1"), "router.alert_token: set router.alert_url too"),
        (lambda d: d["router"].update(alert_format="ntfy"), "router.alert_format: set router.alert_url too"),
        (
            lambda d: d["router"].update(alert_url="https://ntfy.sh/x", alert_token="tk\nX-Evil: 1"),
            "router.alert_token",
        ),
    ],
)
def test_each_mistake_names_its_key(mutate, key, tmp_path):
    data = base()
    mutate(data)
    with pytest.raises(ConfigError) as exc:
        parse_config(data, tmp_path)
    assert key in exc.value.message


def test_alert_settings(tmp_path):
    settings = parse_config(
        base(alert_url="https://ntfy.sh/gpu-lab/", alert_format="ntfy", alert_token="tk_1"), tmp_path
    )
    assert (settings.alert_url, settings.alert_format, settings.alert_token) == (
        "https://ntfy.sh/gpu-lab/",
        "ntfy",
        "tk_1",
    )
    assert "tk_1" not in repr(settings)
    webhook = parse_config(base(alert_url="http://127.0.0.1:9000/hooks/gpuq?token=abc"), tmp_path)
    assert webhook.alert_url == "http://127.0.0.1:9000/hooks/gpuq?token=abc"  # a query is the receiver's
    plain = parse_config(base(), tmp_path)
    assert plain.alert_url is None and plain.alert_format == "json"


def test_not_toml_and_missing_file_and_no_nodes(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[router\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "missing.toml")
    empty = tmp_path / "empty.toml"
    empty.write_text("[router]\n")
    with pytest.raises(ConfigError, match="at least one"):
        load_config(empty)


def test_a_nodes_think_takes_ollamas_levels_max_too(tmp_path):
    data = base()
    data["node"][0]["think"] = "max"  # Ollama 0.22 (api/types.go ThinkValue)
    assert parse_config(data, tmp_path).nodes[0].think == "max"
    data["node"][0]["think"] = "lots"
    with pytest.raises(ConfigError) as exc:
        parse_config(data, tmp_path)
    assert exc.value.message == (
        'node \'node-1\'.think: invalid think value: "lots" (must be "high", "medium", "low", "max", true, or false)'
    )


def test_users_take_tokens_roles_lanes_and_limits_and_the_single_token_stays_an_admin(tmp_path, monkeypatch):
    monkeypatch.setenv("BOB_TOKEN", "bob-secret")
    data = base(token="router-secret")
    data["user"] = [
        {"name": "alice", "token": "alice-secret", "role": "admin"},
        {"name": "bob", "token_env": "BOB_TOKEN", "lanes": ["batch"], "max_waiting": 50, "max_running": 1},
        {"name": "carol@example.com"},  # a tailnet login: no token
    ]
    settings = parse_config(data, tmp_path)
    assert [u.name for u in settings.users] == ["admin", "alice", "bob", "carol@example.com"]
    assert settings.user_by_token("router-secret").admin and settings.user_by_token("alice-secret").admin
    bob = settings.user_by_token("bob-secret")
    assert (bob.name, bob.role, bob.lanes, bob.max_waiting, bob.max_running) == ("bob", "member", ("batch",), 50, 1)
    assert settings.user_by_token("nobody's") is None and settings.shares_fairly


@pytest.mark.parametrize(
    "users, message",
    [
        (
            [{"name": "a", "token": "same"}, {"name": "b", "token": "same"}],
            "user 'b'.token: the same token as user 'a'; each user needs their own",
        ),
        ([{"name": "a"}, {"name": "a"}], "user 'a'.name: duplicate user name"),
        ([{"name": "a", "role": "owner"}], "user 'a'.role: expected 'admin' or 'member', got 'owner'"),
        (
            [{"name": "a", "lanes": ["fast"]}],
            "user 'a'.lanes: expected a non-empty list of 'interactive' and/or 'batch', got ['fast']",
        ),
        (
            [{"name": "a", "token_env": "GPUQ_NO_SUCH_VARIABLE"}],
            "user 'a'.token_env: the environment variable $GPUQ_NO_SUCH_VARIABLE is not set",
        ),
        (
            [{"name": "a", "token_env": "$GPUQ_A"}],
            "user 'a'.token_env: expected an environment variable's name like GPUQ_ALICE_TOKEN, got '$GPUQ_A'",
        ),
        ([{"name": "a", "max_waiting": 0}], "user 'a'.max_waiting: must be from 1 to 1000000, got 0"),
        ([{"name": "a b"}], "user[1].name: use letters, digits, '.', '_', '@', '+' or '-', got 'a b'"),
    ],
)
def test_each_users_mistake_names_its_key(users, message, tmp_path):
    data = base()
    data["user"] = users
    with pytest.raises(ConfigError) as exc:
        parse_config(data, tmp_path)
    assert exc.value.message == message


def test_interactive_preempts_is_on_unless_set_off_and_must_be_a_boolean(tmp_path):
    assert parse_config(base(), tmp_path).interactive_preempts is True
    assert parse_config(base(interactive_preempts=False), tmp_path).interactive_preempts is False
    with pytest.raises(ConfigError, match="router.interactive_preempts"):
        parse_config(base(interactive_preempts="yes"), tmp_path)


def test_a_routers_lease_on_its_nodes_is_ten_seconds_unless_set_and_never_under_a_second(tmp_path):
    assert parse_config(base(), tmp_path).lease_s == 10.0
    assert parse_config(base(lease="30s"), tmp_path).lease_s == 30.0
    with pytest.raises(ConfigError, match=r"router.lease: must be at least 1000ms \(a router would lose its nodes"):
        parse_config(base(lease="500ms"), tmp_path)


def test_scheduled_backups_are_on_by_default_beside_the_database_and_can_be_set_or_turned_off(tmp_path):
    default = parse_config(base(), tmp_path)
    assert (default.backup_every_s, default.backup_keep) == (86400.0, 7)
    assert default.backups_dir == (tmp_path / "gpuq-backups").resolve()
    assert (default.storage_warn_days, default.storage_sample_s) == (14.0, 3600.0)
    set_ = parse_config(
        {
            **base(),
            "backup": {"every": "6h", "keep": 3, "dir": "bk"},
            "storage": {"warn_days": 30, "sample_every": "10m"},
        },
        tmp_path,
    )
    assert (set_.backup_every_s, set_.backup_keep, set_.backups_dir) == (21600.0, 3, (tmp_path / "bk").resolve())
    assert (set_.storage_warn_days, set_.storage_sample_s) == (30.0, 600.0)
    for off in ("off", "OFF", 0, "0s"):
        assert parse_config({**base(), "backup": {"every": off}}, tmp_path).backup_every_s is None
    on_pg = parse_config(base(database="postgresql://gpuq@db.lab/gpuq"), tmp_path)
    assert on_pg.backup_every_s is None and on_pg.backups_dir is None  # pg_dump's, not gpuq's
    off_on_pg = parse_config({**base(database="postgresql://gpuq@db.lab/gpuq"), "backup": {"every": "off"}}, tmp_path)
    assert off_on_pg.backup_every_s is None


@pytest.mark.parametrize(
    ("tables", "message"),
    [
        ({"backup": {"every": "500ms"}}, "backup.every: must be at least 1s (or \"off\"), got '500ms'"),
        ({"backup": {"every": "soon"}}, "backup.every: "),
        ({"backup": {"keep": 0}}, "backup.keep: must be from 1 to 1000, got 0"),
        ({"backup": {"keep": "7"}}, "backup.keep: expected int, got '7'"),
        ({"backup": {"dir": ""}}, "backup.dir: expected a folder's path, got ''"),
        ({"backup": {"evry": "1d"}}, "backup: unknown key 'evry' (known: dir, every, keep)"),
        ({"storage": {"warn_days": 0}}, "storage.warn_days: must be from 1 to 3650, got 0"),
        ({"storage": {"sample_every": "0.5s"}}, "storage.sample_every: must be at least 1s, got '0.5s'"),
        (
            {"router": {"database": "postgresql://gpuq@db.lab/gpuq"}, "backup": {"every": "1d"}},
            "[backup]: the database is on PostgreSQL, and gpuq does not back PostgreSQL up itself: use pg_dump",
        ),
    ],
)
def test_backup_and_storage_mistakes_name_their_key(tmp_path, tables, message):
    data = {**base(**tables.pop("router", {})), **tables}
    with pytest.raises(ConfigError) as err:
        parse_config(data, tmp_path)
    assert str(err.value).startswith(message), str(err.value)


def test_front_model_aliases_keep_the_files_order_and_name_a_wrong_entry(tmp_path):
    data = dict(base(), front={"model_aliases": {"claude-*": "qwen3:8b", "gpt-*": "llama3.2"}})
    assert parse_config(data, tmp_path).front_model_aliases == (("claude-*", "qwen3:8b"), ("gpt-*", "llama3.2"))
    assert parse_config(base(), tmp_path).front_model_aliases == ()
    for aliases, message in (
        (["claude-*"], "front.model_aliases: expected a table"),
        ({"claude-*": 3}, "front.model_aliases.'claude-*': expected a model's name"),
        ({"claude-*": "qwen 3"}, "expected a model's name"),
        ({" claude-*": "qwen3"}, "a name pattern"),
    ):
        with pytest.raises(ConfigError, match=re.escape(message)):
            parse_config(dict(base(), front={"model_aliases": aliases}), tmp_path)
