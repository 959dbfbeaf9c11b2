"""Examples of the API's request bodies and answers, for its OpenAPI document (a test holds the
machine's and the history's keys equal to what the API answers)."""

from __future__ import annotations

from typing import Any

MACHINE_ID = "3f2b8c1e-5d4a-4e8b-9c7d-2a1b0c9d8e7f"
AGENT_ID = "6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b"
WHEN = "2026-11-25T14:00:00.123456+00:00"

MACHINE: dict[str, Any] = {
    "id": MACHINE_ID,
    "type": "cto_build_project",
    "agent_type": "cto",
    "agent_id": AGENT_ID,
    "current_state": "WRITE_CODE",
    "status": "running",
    "context": {"projectName": "sla-api", "githubIssue": 726},
    "attempt": 3,
    "state_retries": 1,
    "github_issue": 726,
    "definition_version": 1,
    "deadline_at": "2026-11-25T14:10:00+00:00",
    "heartbeat_at": WHEN,
    "progress": "tests written, 4 of 9 passing",
    "tokens_used": 18250,
    "cost": 0.41,
    "budget_tokens": 200000,
    "budget_cost": 5.0,
    "error": None,
    "created_at": "2026-11-25T13:52:11.004211+00:00",
    "updated_at": WHEN,
    "parent_id": None,
    "parent_attempt": None,
    "branch": None,
    "root_id": None,
    "depth": 0,
    "queued_at": None,
    "queue_position": None,
    "forked_from": None,
    "forked_at": None,
    "key": None,
    "commands": ["pause", "retry", "force", "budget", "cancel"],
}
CHILD_ID = "9a4e7d21-0c3b-4f5a-8e6d-1b2c3d4e5f60"
CHILD: dict[str, Any] = MACHINE | {
    "id": CHILD_ID,
    "type": "cto_build_project.BUILD.tests",
    "agent_type": "writer",
    "current_state": "WRITE",
    "context": {"projectName": "sla-api"},
    "attempt": 1,
    "state_retries": 0,
    "github_issue": 726,
    "parent_id": MACHINE_ID,
    "parent_attempt": 4,
    "branch": "tests",
    "root_id": MACHINE_ID,
    "depth": 1,
}
FAN_OUT: dict[str, Any] = {
    "state": "RESEARCH",
    "attempt": 4,
    "kind": "map",
    "total": 10000,
    "verdict": "pending",
    "done": 9000,
    "failed": 12,
    "running": 978,
    "waiting": 10,
    "cancelled": 0,
    "created_at": WHEN,
    "decided_at": None,
    "closed_at": None,
}


def _node(machine_id: str, machine_type: str, branch: str | None, state: str) -> dict[str, Any]:
    return {
        "id": machine_id,
        "type": machine_type,
        "branch": branch,
        "current_state": state,
        "status": "running",
        "attempt": 1,
        "error": None,
        "children": [],
        "more": {},
    }


TREE: dict[str, Any] = _node(MACHINE_ID, "research_fanout", None, "RESEARCH") | {
    "attempt": 4,
    "children": [_node(CHILD_ID, "research_fanout.RESEARCH", "0", "RESEARCH")],
    "more": {"completed": 9000, "failed": 12, "running": 977, "waiting": 10},
}
HISTORY_ROW: dict[str, Any] = {
    "attempt": 2,
    "event": "ack",
    "from_state": "DESIGN",
    "to_state": "WRITE_CODE",
    "success": True,
    "output": {"design": "three endpoints behind one service"},
    "error_message": None,
    "failure": None,
    "duration_ms": 84211,
    "actor": None,
    "reason": None,
    "progress": None,
    "agent_id": AGENT_ID,
    "tokens_used": 9120,
    "cost": 0.2,
    "created_at": WHEN,
}
NOTIFICATION: dict[str, Any] = {
    "id": 17,
    "url": "https://hooks.example.com",
    "event": "completed",
    "status": "pending",
    "attempts": 2,
    "next_attempt_at": WHEN,
    "last_error": "HTTP 503",
    "created_at": WHEN,
    "delivered_at": None,
}
BUDGET_CHANGE: dict[str, Any] = {
    "id": 4,
    "machine_id": MACHINE_ID,
    "actor": "carol",
    "reason": "the refactor needs more room",
    "tokens": 200000,
    "cost": 5.0,
    "previous_tokens": 100000,
    "previous_cost": 2.5,
    "created_at": WHEN,
}
SCHEDULE: dict[str, Any] = {
    "machine_type": "cto_infrastructure_check",
    "name": "nightly",
    "cron": "0 3 * * *",
    "timezone": "UTC",
    "overlap": "skip",
    "context": {},
    "paused": False,
    "removed": False,
    "next_run_at": "2026-11-26T03:00:00+00:00",
    "last_tick_at": "2026-11-25T03:00:00+00:00",
    "last_machine_id": MACHINE_ID,
    "last_run_at": "2026-11-25T03:00:00+00:00",
    "last_outcome": "started",
    "last_detail": None,
    "schedule": "cto_infrastructure_check/nightly",
}
COMMAND = {"reason": "waiting for the database migration", "actor": "carol"}

REQUESTS: dict[str, list[dict[str, Any]]] = {
    "StartRequest": [
        {
            "type": "cto_build_project",
            "context": {"projectName": "sla-api", "githubIssue": 726},
            "github_issue": 726,
            "key": "sla-api#726",
        }
    ],
    "CommandRequest": [COMMAND, {}],
    "ForceRequest": [{"state": "RUN_TESTS", "reason": "the tests were fixed by hand"}],
    "RevokeRequest": [{"reason": "the laptop holding its credentials was lost"}, {}],
    "BudgetRequest": [{"tokens": 200000, "cost": 5.0, "reason": "the refactor needs more room"}],
    "RewindRequest": [
        {"step": 5, "set": {"testCommand": "pytest -x"}, "reason": "the tests ran the wrong suite"}
    ],
    "EventRequest": [
        {"payload": {"merged": True, "number": 812}, "key": "github-delivery-72d3162e"},
    ],
    "DecisionRequest": [
        {"decision": "approve", "fields": {"target": "production"}, "comment": "tests green"},
        {"decision": "reject", "comment": "the migration needs a rollback plan", "attempt": 7},
    ],
    "BulkRequest": [
        {
            "action": "pause",
            "filter": {"type": "cto_build_project", "status": "running"},
            "reason": "Redis maintenance",
            "limit": 100,
        }
    ],
}

GATE = {
    "id": 12,
    "machine_id": MACHINE_ID,
    "state": "APPROVE_DEPLOY",
    "attempt": 7,
    "opened_at": "2026-11-25T13:40:00+00:00",
    "deadline_at": "2026-11-26T13:40:00+00:00",
    "approvals": 1,
    "rejections": 0,
    "needed": 2,
    "verdict": "pending",
    "closed_at": None,
}

ANSWERS: dict[str, Any] = {
    "list_machines": {"items": [MACHINE], "next": "WyIyMDI2LTExLTI1VDEzOjUyOjExIiwgIjNmMmIiXQ"},
    "children": {"items": [CHILD], "next": None},
    "tree": {"tree": TREE},
    "fan_outs": {"items": [FAN_OUT]},
    "count_machines": {"total": 42, "by_status": {"running": 12, "completed": 30}},
    "start_machine": {
        "machine": MACHINE | {"current_state": "DESIGN", "attempt": 1, "key": "sla-api#726"}
    },
    "bulk": {
        "done": 1,
        "refused": 1,
        "results": [
            {"machine_id": MACHINE_ID, "ok": True, "status": "paused", "error": None},
            {
                "machine_id": AGENT_ID,
                "ok": False,
                "status": "completed",
                "error": "a completed machine cannot be paused",
            },
        ],
    },
    "get_machine": {
        "machine": MACHINE,
        "history": [HISTORY_ROW],
        "notifications": [NOTIFICATION],
        "budget_changes": [BUDGET_CHANGE],
        "forks": [],
    },
    "history": {
        "items": [
            HISTORY_ROW
            | {
                "change": {"set": {"testsPassed": True}},
                "context": {"projectName": "sla-api", "githubIssue": 726, "testsPassed": True},
                "known": True,
            }
        ],
        "next": None,
    },
    "context_at": {
        "machine_id": MACHINE_ID,
        "step": 5,
        "event": "ack",
        "from_state": "WRITE_CODE",
        "state": "RUN_TESTS",
        "context": {"projectName": "sla-api", "githubIssue": 726, "filesCreated": ["api.py"]},
    },
    "replay": {
        "machine_id": MACHINE_ID,
        "machine_type": "cto_fix_bug",
        "version": 2,
        "against": "v3",
        "status": "completed",
        "outcome": "diverged",
        "at": 5,
        "why": "RUN_TESTS: → WRITE_FIX now, the run went → COMMIT_PUSH: "
        "guard 'output.coverage > `90`' → COMMIT_PUSH is false; the default edge → WRITE_FIX "
        "is taken",
        "replayed_status": None,
        "steps": [
            {
                "step": 4,
                "event": "ack",
                "state": "WRITE_FIX",
                "recorded": "RUN_TESTS",
                "replayed": "RUN_TESTS",
                "why": None,
            },
            {
                "step": 5,
                "event": "ack",
                "state": "RUN_TESTS",
                "recorded": "COMMIT_PUSH",
                "replayed": "WRITE_FIX",
                "why": "RUN_TESTS: → WRITE_FIX now, the run went → COMMIT_PUSH: ...",
            },
        ],
    },
    "command": {"machine": MACHINE | {"status": "paused"}},
    "force": {"machine": MACHINE | {"current_state": "RUN_TESTS"}},
    "rewind": {"machine": MACHINE | {"current_state": "RUN_TESTS", "attempt": 12}, "step": 11},
    "fork": {
        "machine": MACHINE
        | {
            "id": AGENT_ID,
            "current_state": "RUN_TESTS",
            "attempt": 1,
            "forked_from": MACHINE_ID,
            "forked_at": 5,
        }
    },
    "set_budget": {"machine": MACHINE},
    "decide": {
        "decision": {
            "machine_id": MACHINE_ID,
            "state": "APPROVE_DEPLOY",
            "attempt": 7,
            "recorded": True,
            "decision": "approve",
            "approvals": 2,
            "rejections": 0,
            "needed": 2,
            "verdict": "approved",
            "moved_to": "DEPLOY",
            "override": False,
        }
    },
    "send_event": {
        "event": {
            "machine_id": MACHINE_ID,
            "name": "pr_merged",
            "outcome": "applied",
            "state": "DEPLOY",
            "moved_to": "DEPLOY",
        }
    },
    "machine_events": {
        "items": [
            {
                "id": 5,
                "machine_id": MACHINE_ID,
                "name": "pr_merged",
                "payload": {"merged": True, "number": 812},
                "sender": "github",
                "via": "github",
                "key": "72d3162e-cc78-11e3-81ab-4c9367dc0958",
                "received_at": WHEN,
                "consumed_at": WHEN,
                "attempt": 9,
                "outcome": "applied",
            }
        ]
    },
    "approvals": {
        "items": [
            GATE
            | {
                "type": "cto_build_project",
                "status": "running",
                "github_issue": 726,
                "parent_id": None,
            }
        ]
    },
    "decisions": {
        "gates": [GATE],
        "decisions": [
            {
                "id": 31,
                "gate_id": 12,
                "machine_id": MACHINE_ID,
                "actor": "alice",
                "decision": "approve",
                "fields": {"target": "production"},
                "comment": "tests green",
                "via": "dashboard",
                "override": False,
                "created_at": WHEN,
                "state": "APPROVE_DEPLOY",
                "attempt": 7,
            }
        ],
    },
    "list_agents": {
        "items": [
            {
                "id": AGENT_ID,
                "agent_type": "cto",
                "status": "active",
                "concurrency": 4,
                "running": 1,
                "hostname": "agents-1",
                "started_at": "2026-11-25T09:00:00+00:00",
                "last_seen_at": WHEN,
                "working_on": [
                    {
                        "id": MACHINE_ID,
                        "type": "cto_build_project",
                        "agent_id": AGENT_ID,
                        "current_state": "WRITE_CODE",
                        "status": "running",
                        "attempt": 3,
                        "entered_at": WHEN,
                        "progress": "tests written, 4 of 9 passing",
                    }
                ],
            }
        ]
    },
    "list_definitions": {
        "items": [
            {
                "type": "cto_build_project",
                "version": 1,
                "agent_type": "cto",
                "description": "Build a project from an issue, to production",
                "initial_state": "DESIGN",
                "created_at": WHEN,
                "machines": 12,
            }
        ]
    },
    "get_definition": {
        "type": "cto_build_project",
        "version": 1,
        "versions": [1],
        "created_at": WHEN,
        "valid": True,
        "problems": [],
        "definition": {"type": "cto_build_project", "agent_type": "cto", "states": ["…"]},
        "graph": {"nodes": ["…"], "links": ["…"], "branches": {"BUILD": ["…"]}},
        "dot": "digraph cto_build_project { … }",
    },
    "stats": {
        "machines": {"cto_build_project": {"running": 3, "completed": 40}},
        "by_status": {"running": 3, "completed": 40},
        "by_type": {"cto_build_project": 43},
        "by_agent_type": {"cto": 43},
        "completion_rate": {"cto_build_project": 0.93},
        "states": {
            "cto_build_project": {
                "DESIGN": {
                    "attempts": 44,
                    "success_rate": 0.98,
                    "mean_ms": 61210.4,
                    "p50_ms": 58000,
                    "p95_ms": 120000,
                }
            }
        },
        "usage": {"by_type": {"…": "…"}, "by_agent": {"…": "…"}},
        "rejected": {"stale_attempt": 2},
        "as_of": {"folded_through": 9120, "unfolded": 3, "complete": True},
    },
    "rejected": {
        "items": [
            {
                "id": 88,
                "received_at": WHEN,
                "reason": "stale_attempt",
                "detail": "attempt 2 was decided; the machine is at attempt 3",
                "machine_id": MACHINE_ID,
                "state": "DESIGN",
                "attempt": 2,
                "payload": '{"type": "state_ack", "…": "…"}',
            }
        ]
    },
    "revoke_agent": {"agent": AGENT_ID, "revoked": True, "user_deleted": True},
    "list_schedules": {"items": [SCHEDULE]},
    "schedule_action": {"schedule": SCHEDULE | {"paused": True}},
}


def answer(name: str, status: int = 200) -> dict[int | str, dict[str, Any]]:
    """The `responses` of a route: its answer's example under its status."""
    return {status: {"content": {"application/json": {"example": ANSWERS[name]}}}}
