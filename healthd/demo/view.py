"""Showing the demo to a person: a live terminal screen, a plain line log, a summary.

On a terminal, `LiveView` redraws one compact screen about four times a second:
nodes by verdict, AppWrappers with their phase and nodes, each slack queue's
lendingLimit against its nominalQuota, the breaker, the current step and the last
lines of the story (state changes, steps and Events). Anywhere else (a pipe, a
CI log) the demo prints one line per observed change instead (`line`), so the
story reads top to bottom. `summary` is the end.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TextIO

import anyio

from healthd.demo.observe import NONE, State

if TYPE_CHECKING:
    from healthd.demo.player import Recorder

REDRAW_S = 0.25
STORY_SHOWN = 14
LOG_SHOWN = 3
CLEAR = "\x1b[H\x1b[2J"
_COLOURS = {"PASS": "32", "WARN": "33", "ERR": "31", "EVICT": "1;35", "TESTING": "36"}


def paint(text: str, verdict: str | None, colour: bool) -> str:
    code = _COLOURS.get(verdict or "")
    return f"\x1b[{code}m{text}\x1b[0m" if colour and code else text


def line(t: float, text: str) -> str:
    """One line of the plain log: `[  12.3s] text`."""
    return f"[{round(t, 1) or 0.0:7.1f}s] {text}"  # never "-0.0s"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*headers).rstrip(), *(fmt.format(*r).rstrip() for r in rows)]


def render_state(state: State, *, colour: bool = False, wide: bool = False) -> list[str]:
    """Nodes, AppWrappers, lending and the breaker as aligned tables; `wide` adds
    each node's findings (code@entity), the last on-demand answer and the networks
    the controller blames it on."""
    nodes = [(name, s["verdict"] or NONE, s["condition"] or "-",
              "cordoned" if s["cordoned"] else "", *(_wide_node(s) if wide else ()))
             for name, s in state["nodes"].items()]
    headers = ("NODE", "VERDICT", "GPUUnhealthy", "", *(WIDE_NODE if wide else ()))
    out = _table(headers, nodes)
    for i, (_, verdict, *_) in enumerate(nodes, start=1):
        out[i] = out[i].replace(verdict, paint(verdict, verdict, colour), 1)
    out.append("")
    out += _table(("APPWRAPPER", "PHASE", "NODES"),
                  [(k, a["phase"] or "-", ", ".join(a["nodes"]) or "-")
                   for k, a in state["appwrappers"].items()]) or []
    out.append("")
    out += _table(("SLACK QUEUE", "FLAVOR/RESOURCE", "NOMINAL", "LENDING LIMIT"),
                  [(q, res, v["nominal"], v["limit"] if v["limit"] is not None
                    else "(none: all lendable)")
                   for q, resources in state["lending"].items()
                   for res, v in resources.items()])
    is_open = state["breaker_open"]
    breaker = paint("OPEN (resets stopped)", "EVICT", colour) if is_open else "closed"
    out.append(f"circuit breaker: {breaker}")
    return out


WIDE_NODE = ("FINDINGS", "LAST REQUEST", "BLAMED ON")


def _wide_node(s: dict[str, Any]) -> tuple[str, str, str]:
    run = s.get("last_run")
    answer = "-"
    if isinstance(run, dict):
        answer = f"{run.get('kind')} {run.get('request')}: " + (
            "accepted" if run.get("accepted") else f"refused ({run.get('error')})")
    return (", ".join(s.get("findings") or []) or "-", answer,
            ", ".join(s.get("blamed_on") or []) or "-")


def screen(title: str, t: float, step: str, state: State | None, story: Sequence[str],
           logs: Sequence[str], width: int = 160) -> str:
    """The whole live screen as one string, each line cut to `width` characters."""
    out = [f"healthd demo: {title}   t={t:5.1f}s", f"  {step}", ""]
    if state is not None:
        out += render_state(state, colour=True)
    out += ["", "WHAT HAPPENED (state changes, steps, Events)", *story[-STORY_SHOWN:]]
    if logs:
        out += ["", "LOG", *logs[-LOG_SHOWN:]]
    return CLEAR + "\n".join(_cut(text, width) for text in out) + "\n"


def _cut(text: str, width: int) -> str:
    """Cut to `width` visible characters (colour codes do not count)."""
    visible = len(re.sub(r"\x1b\[[0-9;]*m", "", text))
    return text if visible <= width else text[:width - 3 + len(text) - visible] + "..."


class LiveView:
    """Redraws the screen on `stream` until cancelled (see the module docstring)."""

    def __init__(self, stream: TextIO, title: str) -> None:
        self.stream, self.title = stream, title
        self.logs: list[str] = []  # warnings logged meanwhile (kept off the screen)
        self.story: list[str] = []  # what changed, as the line log would print it

    def add_line(self, t: float, text: str) -> None:
        self.story.append(line(t, text))

    async def run(self, recorder: Recorder) -> None:
        while True:
            self.draw(recorder)
            await anyio.sleep(REDRAW_S)

    def draw(self, recorder: Recorder) -> None:
        steps = recorder.steps
        current = steps[-1] if steps else None
        step = "starting the cluster"
        if current is not None:
            step = " ".join(p for p in (f"step {current['index']}: {current['action']}",
                                        current["what"], f"[{current['result']}]") if p)
            step += f"\n  # {current['note']}" if current["note"] else ""
        width = shutil.get_terminal_size((160, 50)).columns
        self.stream.write(screen(self.title, recorder.now(), step, recorder.state,
                                 self.story, self.logs, width))
        self.stream.flush()


def timing_lines(marks: dict[str, float], timings: dict[str, float]) -> list[str]:
    """The scenario's timings, then the marks in the order they happened, each with
    its time after the first and after the one before (what each step of a chain
    took); nothing when it has no marks."""
    if not marks:
        return []
    out = [""] + [f"timing {name}: {seconds:.2f} s" for name, seconds in timings.items()]
    ordered = sorted(marks.items(), key=lambda item: item[1])  # stable: ties keep step order
    first = ordered[0][1]
    rows, before = [], first
    for name, t in ordered:
        rows.append((name, f"{t:.2f}", f"{t - first:+.2f}", f"{t - before:+.2f}"))
        before = t
    return out + _table(("MARK", "AT (s)", "SINCE FIRST", "SINCE PREVIOUS"), rows)


def summary(result: dict[str, Any], *, with_state: bool = True, wide: bool = False) -> str:
    """The end of the story: PASSED/FAILED, the failure, the timings, the final state."""
    verdict = "PASSED" if result["passed"] else "FAILED"
    head = (f"{verdict}: scenario {result['scenario']} ({len(result['steps_done'])} of "
            f"{result['step_count']} steps) in {result['duration_s']:.1f} s")
    out = [head]
    if result["failure"]:
        out.append(f"  {result['failure']}")
    out += timing_lines(result.get("marks") or {}, result.get("timings") or {})
    final = result["timeline"][-1]["state"] if result["timeline"] else None
    if final is not None and with_state:
        out += ["", *render_state(final, wide=wide)]
    return "\n".join(out)
