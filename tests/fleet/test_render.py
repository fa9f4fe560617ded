"""What a person reads from the fleet tools without a cluster: ages, the progress
line, the summary and exit code of a trigger run, and command-line mistakes."""

from __future__ import annotations

import pytest

from healthd.cli import main
from healthd.fleet.render import age, answer_line, progress_line, trigger_summary
from healthd.fleet.trigger import (
    ANSWERED,
    NO_ANSWER,
    REFUSED,
    REQUESTED,
    NodeOutcome,
    Plan,
    Report,
)


@pytest.mark.parametrize(("seconds", "text"), [
    (None, "-"), (0, "0s"), (59.9, "59s"), (90, "1m30s"), (600, "10m"), (3600, "1h"),
    (7500, "2h5m"), (86400 * 3 + 7200, "3d2h"),
])
def test_ages_read_like_kubectl(seconds: float | None, text: str) -> None:
    assert age(seconds) == text


def outcome(node: str, state: str, **checks: str) -> NodeOutcome:
    return NodeOutcome(node, state=state, accepted=True if state == ANSWERED else None,
                       checks=dict(checks))


def report(*outcomes: NodeOutcome, waited: bool = True) -> Report:
    return Report(Plan("remapped", "trigger-x"), {o.node: o for o in outcomes}, waited=waited)


def test_progress_counts_done_failed_and_running() -> None:
    r = report(outcome("a", ANSWERED, remapped="PASS"), outcome("b", ANSWERED, remapped="ERR"),
               outcome("c", NO_ANSWER), outcome("d", REQUESTED), outcome("e", "pending"))
    assert progress_line(r) == "trigger: 3/5 done, 2 failed, 1 running"


@pytest.mark.parametrize(("outcomes", "code"), [
    ([outcome("a", ANSWERED, remapped="PASS")], 0),
    ([outcome("a", ANSWERED, remapped="PASS"), outcome("b", ANSWERED, remapped="WARN")], 1),
    ([outcome("a", ANSWERED, remapped="EVICT"), outcome("b", NO_ANSWER)], 2),
    ([outcome("a", ANSWERED, remapped="WARN"), outcome("b", NO_ANSWER)], 3),
    ([outcome("a", REFUSED)], 3),
    ([outcome("a", ANSWERED, dcgm="NOT RUN: GPUs are busy: held by t/p")], 3),
    ([], 3),
])
def test_the_exit_code_follows_nagios_over_all_nodes(outcomes: list[NodeOutcome],
                                                     code: int) -> None:
    assert report(*outcomes).exit_code == code


def test_a_request_placed_without_waiting_is_not_unknown() -> None:
    assert report(outcome("a", REQUESTED), waited=False).exit_code == 0
    assert report(outcome("a", REQUESTED), waited=True).exit_code == 3


def test_the_summary_names_the_nodes_that_need_a_look() -> None:
    r = report(outcome("a", ANSWERED, remapped="PASS"), outcome("b", NO_ANSWER),
               outcome("c", NO_ANSWER))
    assert trigger_summary(r) == ("request 'remapped' (trigger-x) on 3 nodes: 1 PASS, "
                                  "2 no agent answered (b, c) -> UNKNOWN, exit 3")


@pytest.mark.parametrize(("argv", "message"), [
    (["trigger", "--nodes", "n1", "--checks", "nope"], "unknown check nope"),
    (["trigger", "--nodes", "n1", "--checks", "power", "--batch", "0"], "--batch"),
    (["trigger", "--nodes", "n1", "--checks", "power", "--timeout", "soon"], "--timeout"),
    (["trigger", "--job", "a/b/c", "--checks", "power"], "[NAMESPACE/]APPWRAPPER"),
    (["trigger", "--job", "red/train", "-n", "blue", "--checks", "power"], "another namespace"),
    (["trigger", "--checks", "power"], "one of the arguments"),
    (["status", "--verdict", "GOOD"], "--verdict"),
])
def test_command_line_mistakes_exit_64_with_a_message(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own checks exit from the parser
        code = exc.code
    assert code == 64
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(("o", "line"), [
    (NodeOutcome("a", before="PASS", state=ANSWERED, after="WARN", accepted=True,
                 checks={"pciebw": "WARN"}, duration_s=31.2),
     "a: WARN (before PASS) pciebw=WARN in 31s"),
    (NodeOutcome("b", before="PASS", state=ANSWERED, after="PASS", accepted=True,
                 checks={"dcgm:3": "UNKNOWN"}, reasons={"dcgm:3": "not scheduled within 300 s"},
                 waited_s=300.0),
     "b: PASS (before PASS) dcgm:3=UNKNOWN in 300.0s: dcgm:3: not scheduled within 300 s"),
    (NodeOutcome("c", state=ANSWERED, accepted=False, error="unknown check nope"),
     "c: refused by the agent: unknown check nope"),
    (NodeOutcome("d", state=NO_ANSWER, error="no agent answered within 5m"),
     "d: no agent answered within 5m"),
])
def test_one_line_per_node_for_piped_output(o: NodeOutcome, line: str) -> None:
    assert answer_line(o) == line
