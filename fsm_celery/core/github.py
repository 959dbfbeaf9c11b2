"""What a GitHub webhook delivery asks for (pure): its signature checked, and an `issues` event
turned into the machine to start, or the reason it starts none.

- `assigned`: the issue was given to someone → the build machine (the seed's BUILD_PROJECT
  "trigger: new issue assigned");
- `opened` with the bug label → the bug-fix machine.
Everything else is acknowledged and ignored. The payload is GitHub's (documented at "Webhook
events and payloads", issues); only the fields used are read, each checked and bounded.

The context gives what the shipped definitions' context_schema requires: the repository's name
as projectName, the issue's number as githubIssue, and its title, body and URL besides. A
machine type that requires more is refused its start, and the delivery says so.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass
from typing import Any

from fsm_celery.core.messages import INT32_MAX, unstorable

TITLE_CHARS = 500
NAME_CHARS = 200
BODY_CHARS = 10_000  # of GitHub's 65,536: what an agent needs to read, not an archive


@dataclass(frozen=True)
class Trigger:
    """Start a machine of this type for this issue, unless one is running for it already."""

    machine_type: str
    repository: str
    issue: int
    context: dict[str, Any]


@dataclass(frozen=True)
class Ignored:
    reason: str


def signature_matches(secret: str, body: bytes, header: str | None) -> bool:
    """Whether X-Hub-Signature-256 is the HMAC-SHA256 of the body under the secret (in
    constant time)."""
    if not secret or not header or not header.startswith("sha256="):
        return False
    expected = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected.encode(), header.removeprefix("sha256=").encode())


def decide(
    event: str, payload: Any, *, build_type: str, bug_type: str, bug_label: str
) -> Trigger | Ignored:
    """The machine an `issues` delivery starts, or why it starts none."""
    if event != "issues":
        return Ignored(f"event {event[:50]!r} starts nothing")
    if not isinstance(payload, dict):
        return Ignored("the payload is not a JSON object")
    problem = unstorable(payload, "payload")
    if problem is not None:  # a NUL character, say: nothing of it reaches the database
        return Ignored(problem)
    action = payload.get("action")
    issue = payload.get("issue")
    repository = payload.get("repository")
    if not isinstance(issue, dict) or not isinstance(repository, dict):
        return Ignored("the payload has no issue or repository")
    number = issue.get("number")
    name = repository.get("full_name")
    if not isinstance(number, int) or isinstance(number, bool) or not 0 < number <= INT32_MAX:
        return Ignored("issue.number is not an issue number")
    if not isinstance(name, str) or not 0 < len(name) <= NAME_CHARS:
        return Ignored("repository.full_name is not a repository name")
    if action == "assigned":
        machine_type = build_type
    elif action == "opened" and bug_label in _labels(issue):
        machine_type = bug_type
    else:
        return Ignored(f"issues action {str(action)[:50]!r} starts nothing")
    return Trigger(machine_type, name, number, _context(payload, issue, name, number))


@dataclass(frozen=True)
class Decision:
    """A person's `/approve` or `/reject` comment on an issue: a decision at the approval gate
    of the machine running for it, by the approver whose GitHub account (its numeric id: a
    login can be renamed and re-registered) wrote it."""

    repository: str
    issue: int
    login: str  # shown, never matched
    choice: str  # approve, reject
    fields: dict[str, str]
    comment: str
    user_id: int = 0


COMMAND = re.compile(r"^/(approve|reject)(?:\s+(.*))?$")
FIELD = re.compile(r"^([A-Za-z_][A-Za-z0-9_]{0,49})=(\S{1,200})$")
COMMENT_CHARS = 2000


def comment_decision(event: str, payload: Any) -> Decision | Ignored:
    """The decision an `issue_comment` delivery carries: its first line `/approve` or
    `/reject`, then `key=value` words filling in the gate's form, then a comment
    (`/approve target=production staging looks right`); or why it carries none."""
    if event != "issue_comment" or not isinstance(payload, dict):
        return Ignored(f"event {event[:50]!r} decides nothing")
    if payload.get("action") != "created":
        return Ignored("only a new comment decides")
    problem = unstorable(payload, "payload")
    if problem is not None:
        return Ignored(problem)
    issue, repository, comment = (payload.get(k) for k in ("issue", "repository", "comment"))
    if not (isinstance(issue, dict) and isinstance(repository, dict) and isinstance(comment, dict)):
        return Ignored("the payload has no issue, repository or comment")
    number, name = issue.get("number"), repository.get("full_name")
    if not isinstance(number, int) or isinstance(number, bool) or not 0 < number <= INT32_MAX:
        return Ignored("issue.number is not an issue number")
    if not isinstance(name, str) or not 0 < len(name) <= NAME_CHARS:
        return Ignored("repository.full_name is not a repository name")
    login, user_id = _login(comment.get("user")), _user_id(comment.get("user"))
    body = comment.get("body")
    if login is None or user_id is None or not isinstance(body, str):
        return Ignored("the comment has no author (login and id) or body")
    first = body.strip().split("\n", 1)[0].strip()
    found = COMMAND.match(first)
    if found is None:
        return Ignored("the comment is not /approve or /reject")
    words = (found.group(2) or "").split()
    fields: dict[str, str] = {}
    while words and (pair := FIELD.match(words[0])) is not None:
        fields[pair.group(1)] = pair.group(2)
        words.pop(0)
    text = " ".join(words)[:COMMENT_CHARS]
    return Decision(name, number, login[:NAME_CHARS], found.group(1), fields, text, user_id)


@dataclass(frozen=True)
class Outside:
    """An outside event a delivery carries (fsm_celery.core.signal), for the machines the
    webhook started in its repository: those for the issues a merged pull request closes
    (`pr_merged`), or those whose context's `branch` a finished check ran on
    (`checks_completed`)."""

    repository: str
    name: str
    payload: dict[str, Any]
    issues: tuple[int, ...] = ()
    branch: str | None = None


# GitHub's closing keywords ("Linking a pull request to an issue"): fixes #12, closes #7, ...
CLOSES = re.compile(r"\b(?:close[sd]?|fix(?:e[sd])?|resolve[sd]?)\s*:?\s+#(\d{1,10})\b", re.I)
MOST_ISSUES = 20


def outside_event(event: str, payload: Any, *, fork_heads: bool = False) -> Outside | Ignored:
    """The outside event a `pull_request`, `check_suite` or `workflow_run` delivery carries, or
    why it carries none: a pull request closed and merged is `pr_merged` for the issues its
    title and body close; a check suite or a workflow run completed is `checks_completed` for
    its head branch, when that branch is the repository's own (a fork's only if `fork_heads`)."""
    if not isinstance(payload, dict):
        return Ignored("the payload is not a JSON object")
    problem = unstorable(payload, "payload")
    if problem is not None:
        return Ignored(problem)
    repository = payload.get("repository")
    name = repository.get("full_name") if isinstance(repository, dict) else None
    if not isinstance(name, str) or not 0 < len(name) <= NAME_CHARS:
        return Ignored("repository.full_name is not a repository name")
    if event == "pull_request":
        return _merged(payload, name)
    if event in ("check_suite", "workflow_run"):
        return _checked(payload, event, name, fork_heads)
    return Ignored(f"event {event[:50]!r} carries no event")


def _merged(payload: dict[str, Any], repository: str) -> Outside | Ignored:
    pull = payload.get("pull_request")
    if payload.get("action") != "closed" or not isinstance(pull, dict):
        return Ignored("only a pull request closed is an event")
    if pull.get("merged") is not True:
        return Ignored("the pull request was closed without being merged")
    text = " ".join(str(pull.get(k) or "") for k in ("title", "body"))[:BODY_CHARS]
    issues = tuple(dict.fromkeys(int(n) for n in CLOSES.findall(text) if 0 < int(n) <= INT32_MAX))[
        :MOST_ISSUES
    ]
    if not issues:
        return Ignored("the pull request closes no issue (Fixes #N in its title or body)")
    head, base = _object(pull.get("head")), _object(pull.get("base"))
    fields = {
        "merged": True,
        "number": pull.get("number") if isinstance(pull.get("number"), int) else None,
        "title": str(pull.get("title") or "")[:TITLE_CHARS],
        "url": str(pull.get("html_url") or "")[: NAME_CHARS * 2],
        "branch": str(head.get("ref") or "")[:NAME_CHARS],
        "base": str(base.get("ref") or "")[:NAME_CHARS],
        "mergeCommitSha": str(pull.get("merge_commit_sha") or "")[:64],
        "mergedBy": _login(pull.get("merged_by")),
    }
    return Outside(repository, "pr_merged", fields, issues=issues)


def _checked(
    payload: dict[str, Any], event: str, repository: str, fork_heads: bool
) -> Outside | Ignored:
    run = payload.get(event)
    if payload.get("action") != "completed" or not isinstance(run, dict):
        return Ignored(f"only a {event} completed is an event")
    branch = run.get("head_branch")
    if not isinstance(branch, str) or not 0 < len(branch) <= NAME_CHARS:
        return Ignored(f"the {event} has no head branch")
    fork = _fork(event, run, _object(payload.get("repository")))
    if fork is not None and not fork_heads:
        return Ignored(
            f"the {event} ran on {fork}'s {branch[:50]!r}, not {repository}'s: a fork's checks "
            "move no machine (FSM_GITHUB_FORK_HEADS)"
        )
    app = _object(run.get("app"))
    fields = {
        "headRepository": (fork or repository)[:NAME_CHARS],
        "conclusion": str(run.get("conclusion") or "")[:50],
        "branch": branch,
        "sha": str(run.get("head_sha") or "")[:64],
        "check": str(run.get("name") or app.get("name") or event)[:NAME_CHARS],
        "url": str(run.get("html_url") or run.get("url") or "")[: NAME_CHARS * 2],
    }
    return Outside(repository, "checks_completed", fields, branch=branch)


def _fork(event: str, run: dict[str, Any], repository: dict[str, Any]) -> str | None:
    """The other repository a run's head is in (a fork's pull request), or None when it is the
    delivery's repository. A workflow run names its head repository; a check suite does not (for
    a fork's head GitHub sends no head_branch), but its pull requests name their heads'."""
    head = run.get("head_repository")
    if event == "workflow_run" and not isinstance(head, dict):
        return "an unnamed repository"  # GitHub always names it: trust no run that does not
    heads = [head] if isinstance(head, dict) else []
    pulls = run.get("pull_requests")
    for pull in pulls[:MOST_ISSUES] if isinstance(pulls, list) else []:
        heads.append(_object(_object(_object(pull).get("head")).get("repo")))
    for found in heads:
        if not _same_repository(found, repository):
            name = found.get("full_name") or found.get("name") or found.get("url")
            return str(name)[:NAME_CHARS] if name else "another repository"
    return None


def _same_repository(one: dict[str, Any], other: dict[str, Any]) -> bool:
    """Whether two of a payload's repository objects are one: by GitHub's id when both have it
    (a name can be renamed and taken), else by full name."""
    ids = one.get("id"), other.get("id")
    if all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        return ids[0] == ids[1]
    name = one.get("full_name")
    return isinstance(name, str) and name.lower() == str(other.get("full_name", "")).lower()


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _labels(issue: dict[str, Any]) -> set[str]:
    labels = issue.get("labels")
    if not isinstance(labels, list):
        return set()
    return {
        label["name"]
        for label in labels
        if isinstance(label, dict) and isinstance(label.get("name"), str)
    }


def _context(
    payload: dict[str, Any], issue: dict[str, Any], repo: str, number: int
) -> dict[str, Any]:
    context: dict[str, Any] = {
        "projectName": _project(payload["repository"], repo),
        "repository": repo,
        "githubIssue": number,
    }
    for key, value, most in (
        ("issueTitle", issue.get("title"), TITLE_CHARS),
        ("issueBody", issue.get("body"), BODY_CHARS),
        ("issueUrl", issue.get("html_url"), NAME_CHARS * 2),
        ("assignee", _login(payload.get("assignee")), NAME_CHARS),
        ("sender", _login(payload.get("sender")), NAME_CHARS),
    ):
        if isinstance(value, str) and value:
            context[key] = value[:most]
    return context


def _project(repository: dict[str, Any], full_name: str) -> str:
    """The repository's name (hello-world of octo-org/hello-world)."""
    name = repository.get("name")
    if isinstance(name, str) and 0 < len(name) <= NAME_CHARS:
        return name
    return full_name.rsplit("/", 1)[-1] or full_name


def _user_id(user: Any) -> int | None:
    """A GitHub account's numeric id, which no rename changes."""
    found = user.get("id") if isinstance(user, dict) else None
    if isinstance(found, int) and not isinstance(found, bool) and 0 < found <= 2**53:
        return found
    return None


def _login(user: Any) -> str | None:
    if isinstance(user, dict) and isinstance(user.get("login"), str):
        return str(user["login"])
    return None
