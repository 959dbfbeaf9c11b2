"""The soak's report as a table (bench/soak.py prints it before the same report as JSON)."""

from __future__ import annotations

from typing import Any


def _pairs(mapping: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in mapping.items()) or "none"


def table(report: dict[str, Any]) -> str:
    """The report's figures, a line or a row each."""
    soak, machines, faults = report["soak"], report["machines"], report["faults"]
    actors = report["actors"]
    lines = [
        f"soak: {soak['mode']} mode, {soak['broker']} broker, seed {soak['seed']}, "
        f"{soak['minutes']:g} min of load and faults ({soak['load_and_faults_s']} s), "
        f"drained in {soak['drain_s']} s",
        f"machines started: {_pairs(machines['started'])}; children {machines['children']}",
    ]
    for kind, ends in machines["ended"].items():
        lines.append(f"  {kind:<9} ended: {_pairs(ends)}")
    lines.append(f"faults carried out: {_pairs(faults['carried_out'])}")
    if faults["failed"]:
        lines.append(f"faults that failed: {_pairs(faults['failed'])}")
    exits = {n: len(p["exited_by_itself"]) for n, p in report["processes"].items()}
    exited = {name: n for name, n in exits.items() if n}
    lines.append(f"processes that exited by themselves: {_pairs(exited)}")
    lines.append(
        f"actors: {actors['gates_decided']} gates decided, {actors['events_sent']} events sent, "
        f"{actors['rewinds']} rewinds, {actors['forks']} forks; refused: "
        f"{_pairs(actors['refused'])}; errors: {_pairs(actors['errors'])}; dashboard reads: "
        f"{_pairs(actors['dashboard_reads'])}"
    )
    lines.append(f"rejected messages: {_pairs(report['rejected_messages'])}")
    lines.append("")
    lines.append(f"{'check':<48} {'result':<6} {'checked':>7} {'failed':>6}")
    for name, check in report["checks"].items():
        result = ("pass" if check["checked"] else "n/a") if check["passed"] else "FAIL"
        lines.append(f"{name:<48} {result:<6} {check['checked']:>7} {check['failed']:>6}")
        lines.extend(f"    {failure}" for failure in check["first_failures"])
    lines.append("")
    lines.append(
        f"{'process (RSS MiB)':<30} {'samples':>7} {'first':>7} {'last':>7} {'max':>7} "
        f"{'1st 3rd':>7} {'last 3rd':>8}  flat"
    )
    for name, m in sorted(report["memory"].items()):
        if m["samples"] == 0:
            continue
        flat = {True: "yes", False: "NO", None: "-"}[m["flat"]]
        lines.append(
            f"{name:<30} {m['samples']:>7} {m['first_mb']:>7} {m['last_mb']:>7} {m['max_mb']:>7} "
            f"{m.get('first_third_median_mb', '-'):>7} {m.get('last_third_median_mb', '-'):>8}  "
            f"{flat}"
        )
    lines.append("")
    lines.append("PASSED" if report["passed"] else "FAILED")
    return "\n".join(lines)
