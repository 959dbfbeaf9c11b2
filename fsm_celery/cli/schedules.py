"""`fsm-celery schedules`: the machines beat starts on cron ticks (`list`, `show`), and what an
operator does to a schedule (`pause`, `resume`, `trigger`), audited."""

from __future__ import annotations

from dataclasses import asdict

import click

from fsm_celery.cli.common import audited, client, echo_lines, json_option, limit_option, show
from fsm_celery.engine.schedules import ScheduleInfo
from fsm_celery.terminal import safe, table

SCHEDULE_HEADER = ["SCHEDULE", "CRON", "TIMEZONE", "OVERLAP", "STATE", "NEXT RUN", "LAST RUN"]


@click.group(invoke_without_command=True)
@click.pass_context
def schedules(ctx: click.Context) -> None:
    """Schedules: machines beat starts on cron ticks (list by default; pause, resume, trigger).

    A schedule is named TYPE/NAME (TYPE alone when the type has one). Changes are stored in the
    database, take effect at once on every beat, and are audited (`schedules show`).
    """
    if ctx.invoked_subcommand is None:
        ctx.invoke(schedules_list)


@schedules.command("list")
@json_option()
def schedules_list(as_json: bool) -> None:
    """Every schedule: its cron, state, next tick and latest run."""
    show(
        client().schedules(),
        as_json,
        lambda infos: table(SCHEDULE_HEADER, [_schedule_line(i) for i in infos]),
        lambda infos: [{"schedule": i.key, **asdict(i)} for i in infos],
    )


def _schedule_line(info: ScheduleInfo) -> list[str]:
    state = "retired" if info.removed else "paused" if info.paused else "active"
    last = "-"
    if info.last_run_at is not None:
        last = f"{info.last_outcome} {info.last_run_at:%Y-%m-%d %H:%M:%S}"
    next_run = f"{info.next_run_at:%Y-%m-%d %H:%M:%S}"
    return [info.key, info.cron, info.timezone, info.overlap, state, next_run, last]


@schedules.command("show")
@click.argument("schedule")
@limit_option(20, most=1000)
def schedules_show(schedule: str, limit: int) -> None:
    """A schedule's latest runs and the changes made to it (who, when, why)."""
    fsm = client()
    echo_lines(table(SCHEDULE_HEADER, [_schedule_line(fsm.schedule(schedule))]))
    runs, events = fsm.schedule_history(schedule, limit)
    for r in runs:
        by = f"  by {r['actor']}" if r["actor"] else ""
        line = f"run    {r['tick_at']}  {r['outcome']:8} {r['machine_id'] or '-'}"
        click.echo(safe(f"{line}{by}  {r['detail'] or ''}".rstrip()))
    for e in events:
        why = f"  ({e['reason']})" if e["reason"] else ""
        click.echo(safe(f"change {e['created_at']}  {e['action']:8} by {e['actor']}{why}"))


def _schedule_command(action: str, doc: str) -> None:
    @schedules.command(action, help=doc)
    @click.argument("schedule")
    @audited("Why; kept in the schedule's audit.")
    def command(schedule: str, reason: str, actor: str) -> None:
        fsm = client()
        if action == "trigger":
            click.echo(fsm.trigger_schedule(schedule, actor, reason))
            return
        info = getattr(fsm, f"{action}_schedule")(schedule, actor, reason)
        click.echo(f"{info.key}  {'paused' if info.paused else 'active'}")


_schedule_command("pause", "Start no machine on the schedule's ticks until it is resumed.")
_schedule_command("resume", "Start machines on the schedule's ticks again, from the next on.")
_schedule_command("trigger", "Start the schedule's machine now (whatever its overlap); print it.")

COMMANDS = (schedules,)
