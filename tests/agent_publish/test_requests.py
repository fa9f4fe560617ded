"""On-demand requests: parsing every shape of `healthd.io/run` and `healthd.io/clear`
into a request or a clear error, taking a request exactly once against the emulator
(a newer request written in between is never lost), and the last-run answer."""

from __future__ import annotations

import json

import pytest

import checks
from healthd.config.selection import Selected
from healthd.kube.conventions import Keys, Verdict
from healthd.kube.objects import NODES
from healthd.requests import Request, answer, pointer, read_requests, take, take_ops
from tests.agent_publish.conftest import KEYS, NODE, node_object, running

REGISTRY = checks.REGISTRY


def node_with(annotations: dict[str, str], rv: str = "42") -> dict:
    obj = node_object()
    obj["metadata"]["annotations"].update(annotations)
    obj["metadata"]["resourceVersion"] = rv
    return obj


def one(annotations: dict[str, str]) -> Request:
    (request,) = read_requests(node_with(annotations), KEYS, REGISTRY)
    return request


def test_no_request_annotations_means_no_requests() -> None:
    assert read_requests(node_object(), KEYS, REGISTRY) == []
    assert read_requests({"metadata": {"annotations": "garbage"}}, KEYS, REGISTRY) == []
    assert read_requests({}, KEYS, REGISTRY) == []


def test_all_selects_the_default_non_exclusive_checks() -> None:
    request = one({KEYS.run: "all"})
    assert (request.kind, request.error) == ("run", "")
    names = [s.name for s in request.selected]
    assert "remapped" in names and "dcgm" in names
    assert all(s.arg is None for s in request.selected)


def test_a_list_selects_exactly_those_checks() -> None:
    request = one({KEYS.run: "pciebw,remapped"})
    assert request.selected == [Selected("pciebw"), Selected("remapped")]
    assert request.error == ""


def test_dcgm_level_three_is_accepted() -> None:
    request = one({KEYS.run: "dcgm:3"})
    assert request.selected == [Selected("dcgm", "3")] and request.error == ""
    assert str(request.selected[0]) == "dcgm:3"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("dcgm:9", ["dcgm:9", "level", "4"]),
        ("dcgm:x", ["dcgm:x", "level", "integer"]),
        ("foo", ["unknown check foo", "remapped"]),
        ("", ["empty check name"]),
        ("a,,b", ["empty check name"]),
        ("remapped:3", ["takes no argument"]),
        ("all,remapped", ["all"]),
        ("Remapped!", ["malformed"]),
    ],
)
def test_bad_run_requests_carry_a_clear_error_and_select_nothing(text: str,
                                                                 words: list[str]) -> None:
    request = one({KEYS.run: text})
    assert request.kind == "run" and request.selected == []
    for word in words:
        assert word in request.error


def test_clear_true_is_a_clear_request_and_anything_else_an_error() -> None:
    ok = one({KEYS.clear: "true"})
    assert (ok.kind, ok.error) == ("clear", "")
    bad = one({KEYS.clear: "yes"})
    assert bad.kind == "clear" and bad.error.startswith("healthd.io/clear must be true")


def test_run_and_clear_together_are_two_requests_the_clear_first() -> None:
    requests = read_requests(node_with({KEYS.run: "remapped", KEYS.clear: "true"}), KEYS,
                             REGISTRY)
    assert [r.kind for r in requests] == ["clear", "run"]


def test_a_clear_alone_takes_the_run_id_and_a_run_written_with_it_keeps_it() -> None:
    alone = one({KEYS.clear: "true", KEYS.run_id: "clear-1"})
    assert (alone.id, alone.explicit_id) == ("clear-1", True)
    clear, run = read_requests(node_with({KEYS.clear: "true", KEYS.run: "xid",
                                          KEYS.run_id: "repair-2"}), KEYS, REGISTRY)
    assert clear.id.startswith("clear-") and not clear.explicit_id
    assert (run.id, run.explicit_id) == ("repair-2", True)


def test_request_id_comes_from_run_id_or_is_derived_stably() -> None:
    assert one({KEYS.run: "all", KEYS.run_id: "abc-1"}).id == "abc-1"
    first = read_requests(node_with({KEYS.run: "all"}, rv="7"), KEYS, REGISTRY)[0].id
    again = read_requests(node_with({KEYS.run: "all"}, rv="7"), KEYS, REGISTRY)[0].id
    other = read_requests(node_with({KEYS.run: "all"}, rv="8"), KEYS, REGISTRY)[0].id
    assert first == again != other


def test_json_pointer_escapes_slash_and_tilde() -> None:
    assert pointer("healthd.io/run") == "/metadata/annotations/healthd.io~1run"
    assert pointer("a~b/c") == "/metadata/annotations/a~0b~1c"
    keys = Keys(own_prefix="ex~ample.org/")
    ops = take_ops(Request("i", "all", "run", annotation=keys.run), keys)
    assert ops[0] == {"op": "test", "path": "/metadata/annotations/ex~0ample.org~1run",
                      "value": "all"}


def test_answer_is_the_last_run_json() -> None:
    request = one({KEYS.run: "dcgm:9", KEYS.run_id: "r1"})
    text = answer(request, accepted=False, error=request.error, start=1_750_000_000.0,
                  end=1_750_000_001.0, verdict=Verdict.PASS, checks={})
    body = json.loads(text)
    assert body["id"] == "r1" and body["request"] == "dcgm:9"
    assert body["accepted"] is False and "level" in body["error"]
    assert body["start"] == "2025-06-15T15:06:40Z" and body["end"] == "2025-06-15T15:06:41Z"
    assert body["verdict"] == "PASS" and body["checks"] == {}
    done = json.loads(answer(request, accepted=True, error="", start=0, end=1,
                             verdict=Verdict.ERR, checks={"remapped": "ERR", "dcgm:3": "PASS"}))
    assert done["checks"] == {"remapped": "ERR", "dcgm:3": "PASS"} and done["verdict"] == "ERR"


@pytest.mark.anyio
async def test_take_removes_the_request_exactly_once(api) -> None:
    api.seed(node_with({KEYS.run: "remapped", KEYS.run_id: "req-1"}))
    async with running(api, seed=False) as h:
        (request,) = read_requests(h.node(), KEYS, REGISTRY)
        assert await take(h.publisher, request, KEYS) is True
        annotations = h.node()["metadata"]["annotations"]
        assert KEYS.run not in annotations and KEYS.run_id not in annotations
        assert annotations["team.example/owner"] == "infra"
        assert await take(h.publisher, request, KEYS) is False
        assert len(api.writes("PATCH", f"/api/v1/nodes/{NODE}")) == 2


@pytest.mark.anyio
async def test_a_newer_request_written_in_between_is_not_lost(api) -> None:
    api.seed(node_with({KEYS.run: "remapped"}))
    async with running(api, seed=False) as h:
        (request,) = read_requests(h.node(), KEYS, REGISTRY)
        await h.kube.merge_patch(NODES, NODE, {"metadata": {"annotations": {KEYS.run: "dcgm:3"}}})
        assert await take(h.publisher, request, KEYS) is False
        assert h.node()["metadata"]["annotations"][KEYS.run] == "dcgm:3"
        (newer,) = read_requests(h.node(), KEYS, REGISTRY)
        assert newer.selected == [Selected("dcgm", "3")]
        assert await take(h.publisher, newer, KEYS) is True
        assert KEYS.run not in h.node()["metadata"]["annotations"]


@pytest.mark.anyio
async def test_take_while_the_api_is_away_keeps_the_request(api) -> None:
    api.seed(node_with({KEYS.clear: "true"}))
    async with running(api, seed=False) as h:
        (request,) = read_requests(h.node(), KEYS, REGISTRY)
        await api.go_away()
        assert await take(h.publisher, request, KEYS) is False
        await api.come_back()
        assert h.node()["metadata"]["annotations"][KEYS.clear] == "true"
        assert await take(h.publisher, request, KEYS) is True


def test_answer_carries_the_exact_duration() -> None:
    """Start and end are whole-second Kubernetes timestamps; `duration_s` is what a
    tool such as `healthd trigger` shows."""
    request = Request(id="r1", text="remapped", kind="run", selected=[Selected("remapped")])
    body = json.loads(answer(request, accepted=True, error="", start=100.2, end=100.45,
                             verdict=Verdict.PASS, checks={"remapped": "PASS"}))
    assert body["duration_s"] == 0.25
    assert body["start"] == body["end"]  # same second: the timestamps alone would say 0
