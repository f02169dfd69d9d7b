"""NewJob: the one place a new job's own fields are checked, whichever door builds it."""

import pytest

from gpuq.errors import BadRequest, TooLarge
from gpuq.jobs import NewJob, span

THINK_WORDS = '(must be "high", "medium", "low", "max", true, or false)'


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(kind="batch", prompt="x"), "unknown kind 'batch' (expected 'task' or 'critique')"),
        (dict(kind="embed", prompt="x"), "unknown kind 'embed' (expected 'task' or 'critique')"),  # front door only
        (dict(kind="task", prompt="x", timeout_s=0), "field 'timeout' must be between 0 and 604800 seconds, got 0"),
        (
            dict(kind="task", prompt="x", timeout_s=float("nan")),
            "field 'timeout' must be between 0 and 604800 seconds, got nan",
        ),
        (dict(kind="task", prompt="x", model=" "), "field 'model' must not be empty"),
        (dict(kind="task", prompt="x", think="lots"), f'invalid think value: "lots" {THINK_WORDS}'),
        (
            dict(kind="task", prompt="x", options={"num_ctx": 0}),
            "field 'options': option 'num_ctx' must be at least 1, got 0",
        ),
        (
            dict(kind="critique", prompt=None, parent="../x"),
            "'../x' is not a job id (ids look like 1760883402-9f3a7c21)",
        ),
        (dict(kind="task", prompt="x", parent="1760883402-9f3a7c21"), "only a critique takes a parent"),
        (dict(kind="task", prompt=" \n"), "field 'prompt' must not be empty"),
    ],
)
def test_a_new_job_refuses_bad_fields_however_it_is_built(fields, message):
    with pytest.raises(BadRequest) as exc:
        NewJob(**fields)
    assert exc.value.message == message


def test_a_new_job_keeps_its_fields_as_the_store_wants_them():
    job = NewJob("task", "x", model="  qwen3:8b ", timeout_s=60, think="max")
    assert (job.model, job.timeout_s, job.think) == ("qwen3:8b", 60.0, "max")
    assert isinstance(job.timeout_s, float)
    embed = NewJob("embed", "x", endpoint="/api/embed", request='{"path": "/api/embed"}')  # a front-door call
    assert embed.kind == "embed"


def test_checked_counts_the_prompt_in_utf8_bytes():
    assert NewJob.checked(4, kind="task", prompt="éé").prompt == "éé"
    with pytest.raises(TooLarge) as exc:
        NewJob.checked(4, kind="task", prompt="ééé")
    assert exc.value.message == "prompt is 6 bytes, over the limit of 4 (router.max_prompt_bytes)"


@pytest.mark.parametrize(
    "seconds, shown", [(-3, "0s"), (0.4, "0s"), (42, "42s"), (59.6, "1m00s"), (185, "3m05s"), (7620, "2h07m")]
)
def test_a_span_to_the_second_as_the_cli_and_the_alerts_show_it(seconds, shown):
    assert span(seconds) == shown
