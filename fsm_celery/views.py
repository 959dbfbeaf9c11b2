"""How the command line shows what the client hands back: each list as a header and rows, the
statistics as tables (pure; fsm_celery.terminal makes every cell safe and aligns them)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from fsm_celery.core.replay import Outcome
from fsm_celery.core.transition import MachineStatus
from fsm_celery.engine.replays import MachineReplay
from fsm_celery.records import MachineInfo, TransitionRecord, TreeNode
from fsm_celery.terminal import duration, safe, table

CELL_CHARS = 200  # an agent's error or message shown in a table at most; --json has all of it
STATUSES = [s.value for s in MachineStatus]


def clip(text: str | None, most: int = CELL_CHARS) -> str | None:
    """The text cut to most characters, saying how much was left out."""
    if text is None or len(text) <= most:
        return text
    return f"{text[:most]}… ({len(text) - most} more characters; --json shows all)"


SHOWN = (
    "id",
    "type",
    "status",
    "current_state",
    "attempt",
    "agent_type",
    "agent_id",
    "deadline_at",
    "heartbeat_at",
    "progress",
    "error",
    "created_at",
    "updated_at",
    "parent_id",
    "branch",
    "root_id",
    "depth",
    "queued_at",
    "queue_position",
    "forked_from",
    "forked_at",
    "key",
)
SHORT_ID = 8  # hex digits of an id a tree shows (as the dashboard; the CLI takes the prefix)


def machine(info: MachineInfo) -> list[str]:
    """`status`: one field a line; the context as JSON (ASCII: escapes and all)."""
    data = info.to_dict()
    lines = [f"{key:14} {'-' if data[key] is None else safe(data[key])}" for key in SHOWN]
    return [*lines, f"{'context':14} {json.dumps(data['context'], ensure_ascii=True)}"]


def tree(node: TreeNode) -> list[str]:
    """`tree`: one machine a line under its parent, its type, state and status; the children
    past those listed are one line of counts by status."""
    return [_node_line(node), *_below(node, "")]


def _below(node: TreeNode, indent: str) -> list[str]:
    lines: list[str] = []
    last = len(node.children) - (0 if node.hidden else 1)
    for i, child in enumerate(node.children):
        end = i == last
        lines.append(f"{indent}{'└── ' if end else '├── '}{_node_line(child)}")
        lines += _below(child, indent + ("    " if end else "│   "))
    if node.hidden:
        lines.append(f"{indent}└── {more_text(node)}")
    return lines


def _node_line(node: TreeNode) -> str:
    branch = f"[{node.branch}] " if node.branch is not None else ""
    fields = [str(node.id)[:SHORT_ID], node.type, node.current_state, node.status]
    return safe(branch + "  ".join(fields))


def more_text(node: TreeNode) -> str:
    """The children a tree does not list: "… 9,990 more: 9,000 completed, 12 failed, ..."."""
    counts = ", ".join(f"{n:,} {status}" for status, n in node.more.items())
    return f"… {node.hidden:,} more: {counts}"


def machines(infos: Iterable[MachineInfo]) -> list[str]:
    """`list`: one machine a row."""
    return table(
        ["ID", "TYPE", "STATUS", "STATE", "ATTEMPT", "CREATED"],
        (
            [m.id, m.type, m.status, m.current_state, m.attempt, f"{m.created_at:%Y-%m-%d %H:%M}"]
            for m in infos
        ),
    )


def history(records: Iterable[TransitionRecord]) -> list[str]:
    """`history`: one attempt a row, with who acted and why, and how long the state took."""
    return table(
        ["ATTEMPT", "RESULT", "EVENT", "TRANSITION", "TOOK", "ACTOR", "REASON", "ERROR"],
        (
            [
                r.attempt,
                _result(r),
                r.event,
                f"{r.from_state or '(start)'} -> {r.to_state}",
                duration(r.duration_ms) or None,
                r.actor,
                clip(r.reason or None),
                clip(r.error_message),
            ]
            for r in records
        ),
    )


def _result(record: TransitionRecord) -> str:
    """ok, FAIL, or refused: an answer sent back to its agent, the attempt running on."""
    if record.success:
        return "ok"
    return "refused" if record.event == "refused" else "FAIL"


def changes(records: Iterable[TransitionRecord]) -> list[str]:
    """`history --context`: each step, then what it set (+) and unset (-) in the context."""
    lines = []
    for r in records:
        lines.append(f"#{r.attempt} {r.event} {r.from_state or '(start)'} -> {r.to_state}")
        if r.known is False:
            lines.append("  (recorded before contexts were: unknown)")
            continue
        change = r.change or {}
        for key, value in sorted((change.get("set") or {}).items()):
            lines.append(f"  + {safe(key)} = {clip(json.dumps(value, default=str))}")
        for key in sorted(change.get("unset") or ()):
            lines.append(f"  - {safe(key)}")
    return lines


def agents(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """`agents list`: one agent a row."""
    return table(
        ["ID", "TYPE", "STATUS", "RUNNING", "HOST", "LAST SEEN"],
        (
            [
                a["id"],
                a["agent_type"],
                a["status"],
                f"{a['running']}/{a['concurrency']}",
                a.get("hostname"),
                a["last_seen_at"],
            ]
            for a in rows
        ),
    )


def rejected(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """`rejected`: one refused message a row, newest first."""
    return table(
        ["RECEIVED", "REASON", "MACHINE", "DETAIL"],
        ([r["received_at"], r["reason"], r["machine_id"], clip(r["detail"])] for r in rows),
    )


def parked(rows: Iterable[Mapping[str, str]]) -> list[str]:
    """`rejected --parked`: one dead letter a row, newest first."""
    return table(
        ["PARKED", "SOURCE", "REASON", "MESSAGE"],
        ([p["parkedAt"], p["source"], p["reason"], clip(p["message"])] for p in rows),
    )


def stats(data: Mapping[str, Any]) -> list[str]:
    """`stats`: machines per type and status, attempts per state, usage, rejections."""
    lines = ["Machines", *_machine_counts(data), "", "Attempts per state", *_states(data)]
    lines += ["", "Usage per machine type", *_usage(data["usage"]["by_type"], "TYPE")]
    lines += ["", "Usage per agent", *_usage(data["usage"]["by_agent"], "AGENT")]
    rejections = sorted(data["rejected"].items(), key=lambda item: (-item[1], item[0]))
    lines += ["", "Rejected messages", *table(["REASON", "COUNT"], rejections)]
    if not data["as_of"]["complete"]:
        lines += ["", f"(the latest {data['as_of']['unfolded']} attempts only: beat folds more)"]
    return lines


def _machine_counts(data: Mapping[str, Any]) -> list[str]:
    header = ["TYPE", *(s.upper() for s in STATUSES), "TOTAL", "COMPLETED %"]
    rows = []
    for machine_type, by_status in sorted(data["machines"].items()):
        rate = data["completion_rate"].get(machine_type)
        counts = [by_status.get(s, 0) for s in STATUSES]
        rows.append([machine_type, *counts, sum(counts), _percent(rate)])
    totals = [data["by_status"].get(s, 0) for s in STATUSES]
    rows.append(["(all)", *totals, sum(totals), ""])
    return table(header, rows)


def _states(data: Mapping[str, Any]) -> list[str]:
    header = ["TYPE", "STATE", "ATTEMPTS", "SUCCEEDED %", "MEAN", "P50", "P95"]
    rows = []
    for machine_type, states in sorted(data["states"].items()):
        for state, s in states.items():
            rows.append(
                [
                    machine_type,
                    state or "(start)",
                    s["attempts"],
                    _percent(s["success_rate"]),
                    duration(s["mean_ms"]),
                    duration(s["p50_ms"]),
                    duration(s["p95_ms"]),
                ]
            )
    return table(header, rows)


def _usage(by: Mapping[str, Mapping[str, Any]], what: str) -> list[str]:
    rows = [[key, u.get("attempts", 0), u["tokens"], f"{u['cost']:.4f}"] for key, u in by.items()]
    rows.sort()
    return table([what, "ATTEMPTS", "TOKENS", "COST"], rows)


def _percent(rate: float | None) -> str:
    return "" if rate is None else f"{rate * 100:.1f}"


def replay(found: MachineReplay) -> list[str]:
    """`replay`: each step, where the run went and where the definition goes now, then the
    verdict."""
    r = found.replay
    head = (
        f"machine {found.machine_id} ({found.machine_type} v{found.version}, {found.status}) "
        f"replayed against {safe(found.against)}"
    )
    rows = [
        [
            s.attempt,
            s.event,
            s.state or "(start)",
            s.recorded,
            s.replayed if s.replayed is not None else "(refused)",
            "" if s.same else "<- differs",
        ]
        for s in r.steps
    ]
    lines = [head, *table(["STEP", "EVENT", "FROM", "THE RUN ->", "NOW ->", ""], rows)]
    return [*lines, verdict(found)]


def verdict(found: MachineReplay) -> str:
    r = found.replay
    if r.outcome is Outcome.SAME:
        return f"same path: {len(r.steps)} steps, ends {r.status}"
    if r.outcome is Outcome.DIVERGED:
        return f"diverges at step {r.at}: {safe(r.why or '')}"
    return f"cannot be replayed: {safe(r.why or '')}"


def replays(found: list[MachineReplay], against: str, machine_type: str) -> list[str]:
    """`definitions check --replay-last`: how many take the same path, and the divergences
    grouped by where they happen (state, where the run went, where it goes now)."""
    outcomes = Counter(f.replay.outcome for f in found)
    lines = [
        f"replayed the last {len(found)} ended {machine_type} machines against {safe(against)}: "
        f"{outcomes[Outcome.SAME]} same path, {outcomes[Outcome.DIVERGED]} diverge, "
        f"{outcomes[Outcome.UNREPLAYABLE]} cannot be replayed"
    ]
    groups: dict[tuple[str | None, str, str | None], list[MachineReplay]] = {}
    for f in found:
        step = f.replay.diverged
        if step is not None:
            groups.setdefault((step.state, step.recorded, step.replayed), []).append(f)
    for (state, recorded, now), these in sorted(groups.items(), key=lambda g: -len(g[1])):
        ids = ", ".join(str(f.machine_id)[:8] for f in these[:3])
        more = ", ..." if len(these) > 3 else ""
        lines.append(
            f"  {len(these)} at {state or '(start)'}: the run -> {recorded}, now -> "
            f"{now or '(refused)'} (e.g. {ids}{more})"
        )
        lines.append(f"      {safe(these[0].replay.why or '')}")
    unreplayable = Counter(f.replay.why for f in found if f.replay.outcome is Outcome.UNREPLAYABLE)
    for why, count in unreplayable.most_common():
        lines.append(f"  {count} cannot be replayed: {safe(why or '')}")
    return lines
