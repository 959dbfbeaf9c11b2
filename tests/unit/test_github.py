"""The GitHub webhook's pure core: the signature of a delivery, and the machine an `issues`
delivery asks for (fsm_celery.core.github). Signatures are computed here with hmac/hashlib, as
GitHub computes them, never with the code under test."""

from __future__ import annotations

import copy
import hashlib
import hmac
from typing import Any

import pytest

from fsm_celery.core import github
from fsm_celery.core.context import context_problem
from fsm_celery.core.github import Ignored, Trigger, decide, signature_matches
from fsm_celery.core.loader import SHIPPED_DEFINITIONS, load_file

SECRET = "It's a Secret to Everybody"
BODY = b'{"action":"assigned","issue":{"number":1347}}'
BUILD = "cto_build_project"
BUG = "cto_fix_bug"
LABEL = "bug"
INT32_MAX = 2**31 - 1


def github_signature(secret: str, body: bytes) -> str:
    """X-Hub-Signature-256 as GitHub sends it."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def decided(event: str, payload: Any) -> Trigger | Ignored:
    return decide(event, payload, build_type=BUILD, bug_type=BUG, bug_label=LABEL)


def issues_payload(
    action: str = "assigned",
    *,
    number: Any = 1347,
    title: Any = "Spelling error in the README file",
    labels: list[str] | None = None,
    full_name: Any = "octo-org/hello-world",
    assignee: str | None = "monalisa",
    sender: str = "octocat",
) -> dict[str, Any]:
    """An `issues` delivery's payload as GitHub documents it (the fields that matter here)."""
    users = [{"login": assignee, "id": 2, "type": "User"}] if assignee else []
    payload: dict[str, Any] = {
        "action": action,
        "issue": {
            "url": f"https://api.github.com/repos/octo-org/hello-world/issues/{number}",
            "html_url": f"https://github.com/octo-org/hello-world/issues/{number}",
            "id": 1,
            "number": number,
            "title": title,
            "user": {"login": sender, "id": 1, "type": "User"},
            "labels": [{"id": 208045946, "name": name, "color": "f29513"} for name in labels or []],
            "state": "open",
            "locked": False,
            "assignee": users[0] if users else None,
            "assignees": users,
            "comments": 0,
            "body": "It looks like you accidentally spelled 'commit' with two 't's.",
        },
        "repository": {
            "id": 1296269,
            "name": "hello-world",
            "full_name": full_name,
            "private": False,
            "owner": {"login": "octo-org", "id": 3, "type": "Organization"},
        },
        "sender": {"login": sender, "id": 1, "type": "User"},
    }
    if action in ("assigned", "unassigned"):
        payload["assignee"] = users[0] if users else None
    return payload


# ---- signature_matches --------------------------------------------------------------------


def test_a_signature_github_computed_with_the_secret_matches() -> None:
    assert signature_matches(SECRET, BODY, github_signature(SECRET, BODY))


def test_githubs_documented_example_signature_matches() -> None:
    # GitHub's "Validating webhook deliveries" example: secret, payload and the signature.
    header = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
    assert signature_matches("It's a Secret to Everybody", b"Hello, World!", header)


def test_a_signature_made_with_another_secret_does_not_match() -> None:
    assert not signature_matches(SECRET, BODY, github_signature("another secret", BODY))


def test_a_signature_of_a_body_changed_afterwards_does_not_match() -> None:
    tampered = BODY.replace(b"assigned", b"opened")
    assert not signature_matches(SECRET, tampered, github_signature(SECRET, BODY))


@pytest.mark.parametrize("header", [None, ""], ids=["absent", "empty"])
def test_a_missing_signature_does_not_match(header: str | None) -> None:
    assert not signature_matches(SECRET, BODY, header)


def test_a_signature_without_the_sha256_prefix_does_not_match() -> None:
    bare = hmac.new(SECRET.encode(), BODY, hashlib.sha256).hexdigest()
    assert not signature_matches(SECRET, BODY, bare)
    assert not signature_matches(SECRET, BODY, "sha1=" + bare)


def test_the_legacy_sha1_signature_does_not_match() -> None:
    sha1 = "sha1=" + hmac.new(SECRET.encode(), BODY, hashlib.sha1).hexdigest()
    assert not signature_matches(SECRET, BODY, sha1)


def test_a_truncated_or_bare_prefix_signature_does_not_match() -> None:
    good = github_signature(SECRET, BODY)
    assert not signature_matches(SECRET, BODY, good[:-1])
    assert not signature_matches(SECRET, BODY, "sha256=")


def test_an_empty_secret_matches_nothing_not_even_its_own_signature() -> None:
    assert not signature_matches("", BODY, github_signature("", BODY))


# ---- decide: what starts ------------------------------------------------------------------


def test_an_issue_assigned_starts_the_build_type_for_that_issue() -> None:
    wanted = decided("issues", issues_payload("assigned"))
    assert isinstance(wanted, Trigger)
    assert wanted.machine_type == BUILD
    assert wanted.repository == "octo-org/hello-world"
    assert wanted.issue == 1347


def test_an_issue_opened_with_the_bug_label_starts_the_bug_type() -> None:
    wanted = decided("issues", issues_payload("opened", labels=["triage", "bug"]))
    assert isinstance(wanted, Trigger)
    assert wanted.machine_type == BUG
    assert (wanted.repository, wanted.issue) == ("octo-org/hello-world", 1347)


def test_the_types_and_the_label_are_the_callers() -> None:
    payload = issues_payload("opened", labels=["defect"])
    wanted = decide("issues", payload, build_type="b", bug_type="fix_it", bug_label="defect")
    assert isinstance(wanted, Trigger) and wanted.machine_type == "fix_it"
    assert isinstance(decided("issues", payload), Ignored)  # "defect" is not "bug"


@pytest.mark.parametrize(
    "labels", [[], ["enhancement"], ["Bug fix", "bugs"]], ids=["none", "other", "near-misses"]
)
def test_an_issue_opened_without_the_bug_label_is_ignored(labels: list[str]) -> None:
    wanted = decided("issues", issues_payload("opened", labels=labels))
    assert isinstance(wanted, Ignored)
    assert "opened" in wanted.reason


@pytest.mark.parametrize(
    "labels",
    [None, "bug", {"name": "bug"}, ["bug"], [{"name": 7}], [{"title": "bug"}]],
    ids=["null", "string", "object", "bare-names", "non-string-name", "no-name"],
)
def test_labels_not_shaped_as_github_sends_them_do_not_count(labels: Any) -> None:
    payload = issues_payload("opened")
    payload["issue"]["labels"] = labels
    assert isinstance(decided("issues", payload), Ignored)


@pytest.mark.parametrize(
    "action",
    ["edited", "closed", "reopened", "unassigned", "labeled", "deleted", "transferred", ""],
)
def test_other_issues_actions_are_ignored_even_with_the_bug_label(action: str) -> None:
    wanted = decided("issues", issues_payload(action, labels=["bug"]))
    assert isinstance(wanted, Ignored)
    assert "starts nothing" in wanted.reason


@pytest.mark.parametrize("action", [None, 7, ["assigned"]], ids=["null", "number", "list"])
def test_an_action_that_is_not_a_string_is_ignored(action: Any) -> None:
    payload = issues_payload()
    payload["action"] = action
    assert isinstance(decided("issues", payload), Ignored)


def test_an_issues_payload_without_an_action_is_ignored() -> None:
    payload = issues_payload()
    del payload["action"]
    assert isinstance(decided("issues", payload), Ignored)


@pytest.mark.parametrize(
    "event", ["pull_request", "issue_comment", "push", "ping", "Issues", "", "x" * 10_000]
)
def test_other_events_are_ignored_even_when_shaped_like_an_assignment(event: str) -> None:
    wanted = decided(event, issues_payload("assigned"))
    assert isinstance(wanted, Ignored)
    assert "starts nothing" in wanted.reason
    assert len(wanted.reason) < 200  # the event name is bounded in the reason


@pytest.mark.parametrize("payload", [None, [], "assigned", 1347, True], ids=repr)
def test_a_payload_that_is_not_an_object_is_ignored(payload: Any) -> None:
    wanted = decided("issues", payload)
    assert isinstance(wanted, Ignored)
    assert "JSON object" in wanted.reason


# ---- decide: malformed issue and repository -------------------------------------------------


@pytest.mark.parametrize("field", ["issue", "repository"])
def test_a_payload_without_its_issue_or_repository_is_ignored(field: str) -> None:
    payload = issues_payload()
    del payload[field]
    wanted = decided("issues", payload)
    assert isinstance(wanted, Ignored)
    assert "no issue or repository" in wanted.reason


@pytest.mark.parametrize("field", ["issue", "repository"])
@pytest.mark.parametrize("value", [None, [], "octo-org/hello-world", 1347], ids=repr)
def test_an_issue_or_repository_that_is_not_an_object_is_ignored(field: str, value: Any) -> None:
    payload = issues_payload()
    payload[field] = value
    assert isinstance(decided("issues", payload), Ignored)


@pytest.mark.parametrize(
    "number",
    [None, "1347", 1347.0, True, False, 0, -1, -(2**31), INT32_MAX + 1, 2**64, [1347]],
    ids=repr,
)
def test_an_issue_number_that_is_not_a_positive_int32_is_ignored(number: Any) -> None:
    wanted = decided("issues", issues_payload(number=number))
    assert isinstance(wanted, Ignored)
    assert "issue.number" in wanted.reason


def test_an_issue_without_a_number_is_ignored() -> None:
    payload = issues_payload()
    del payload["issue"]["number"]
    wanted = decided("issues", payload)
    assert isinstance(wanted, Ignored)
    assert "issue.number" in wanted.reason


@pytest.mark.parametrize("number", [1, INT32_MAX])
def test_issue_numbers_at_the_bounds_are_taken(number: int) -> None:
    wanted = decided("issues", issues_payload(number=number))
    assert isinstance(wanted, Trigger) and wanted.issue == number


@pytest.mark.parametrize(
    "full_name", [None, 1296269, ["octo-org/hello-world"], {"x": 1}, "", "o/" + "r" * 199], ids=repr
)
def test_a_repository_name_that_is_not_a_bounded_string_is_ignored(full_name: Any) -> None:
    wanted = decided("issues", issues_payload(full_name=full_name))
    assert isinstance(wanted, Ignored)
    assert "repository.full_name" in wanted.reason


def test_a_repository_without_full_name_is_ignored() -> None:
    payload = issues_payload()
    del payload["repository"]["full_name"]
    assert isinstance(decided("issues", payload), Ignored)


def test_a_repository_name_of_200_chars_is_taken() -> None:
    name = "o/" + "r" * 198
    wanted = decided("issues", issues_payload(full_name=name))
    assert isinstance(wanted, Trigger) and wanted.repository == name


# ---- decide: the context ------------------------------------------------------------------


def test_the_context_names_project_repository_issue_title_body_url_assignee_and_sender() -> None:
    wanted = decided("issues", issues_payload("assigned"))
    assert isinstance(wanted, Trigger)
    assert wanted.context == {
        "projectName": "hello-world",
        "repository": "octo-org/hello-world",
        "githubIssue": 1347,
        "issueTitle": "Spelling error in the README file",
        "issueBody": "It looks like you accidentally spelled 'commit' with two 't's.",
        "issueUrl": "https://github.com/octo-org/hello-world/issues/1347",
        "assignee": "monalisa",
        "sender": "octocat",
    }


def test_a_10000_char_title_is_cut_to_500() -> None:
    title = "t" * 9_999 + "!"
    wanted = decided("issues", issues_payload(title=title))
    assert isinstance(wanted, Trigger)
    assert wanted.context["issueTitle"] == "t" * 500


def test_url_and_logins_are_bounded() -> None:
    payload = issues_payload(assignee="a" * 5_000, sender="s" * 5_000)
    payload["issue"]["html_url"] = "https://github.com/" + "u" * 5_000
    wanted = decided("issues", payload)
    assert isinstance(wanted, Trigger)
    assert len(wanted.context["issueUrl"]) == 400
    assert wanted.context["issueUrl"].startswith("https://github.com/")
    assert wanted.context["assignee"] == "a" * 200
    assert wanted.context["sender"] == "s" * 200


def test_fields_absent_empty_or_not_strings_are_left_out_of_the_context() -> None:
    payload = issues_payload("assigned", title="", assignee=None)
    payload["issue"]["html_url"] = 42
    payload["issue"]["body"] = None  # GitHub's body of an issue opened without one
    payload["sender"] = {"login": ["octocat"]}
    wanted = decided("issues", payload)
    assert isinstance(wanted, Trigger)
    assert wanted.context == {
        "projectName": "hello-world",
        "repository": "octo-org/hello-world",
        "githubIssue": 1347,
    }


def test_a_10000_char_body_is_kept_and_a_longer_one_cut() -> None:
    payload = issues_payload()
    payload["issue"]["body"] = "b" * 10_000 + "!"
    wanted = decided("issues", payload)
    assert isinstance(wanted, Trigger)
    assert wanted.context["issueBody"] == "b" * 10_000


@pytest.mark.parametrize("name", [None, "", 42, "n" * 201])
def test_a_repository_name_that_is_not_a_bounded_string_gives_way_to_the_full_names_tail(
    name: Any,
) -> None:
    payload = issues_payload()
    payload["repository"]["name"] = name
    wanted = decided("issues", payload)
    assert isinstance(wanted, Trigger)
    assert wanted.context["projectName"] == "hello-world"


@pytest.mark.parametrize(
    ("event", "labels", "machine_type"),
    [("assigned", [], BUILD), ("opened", ["bug"], BUG)],
)
def test_the_context_of_each_trigger_matches_its_shipped_definitions_schema(
    event: str, labels: list[str], machine_type: str
) -> None:
    wanted = decided("issues", issues_payload(event, labels=labels))
    assert isinstance(wanted, Trigger)
    schema = load_file(SHIPPED_DEFINITIONS / f"{machine_type}.yaml").context_schema
    assert schema is not None and schema.get("required")
    assert context_problem(schema, wanted.context) is None


def test_an_opened_issue_has_no_assignee_in_its_context() -> None:
    wanted = decided("issues", issues_payload("opened", labels=["bug"], assignee=None))
    assert isinstance(wanted, Trigger)
    assert "assignee" not in wanted.context
    assert wanted.context["sender"] == "octocat"


def test_the_context_takes_only_the_named_fields() -> None:
    payload = issues_payload()
    payload["issue"]["body"] = "x" * 100_000
    payload["extra"] = {"anything": "at all"}
    wanted = decided("issues", payload)
    assert isinstance(wanted, Trigger)
    assert set(wanted.context) <= {
        "projectName",
        "repository",
        "githubIssue",
        "issueTitle",
        "issueBody",
        "issueUrl",
        "assignee",
        "sender",
    }
    assert len(wanted.context["issueBody"]) == 10_000


def test_deciding_leaves_the_payload_as_it_was() -> None:
    payload = issues_payload(title="t" * 10_000)
    before = copy.deepcopy(payload)
    decided("issues", payload)
    assert payload == before


def _commented(body: object, login: object = "monalisa", action: str = "created") -> object:
    return {
        "action": action,
        "issue": {"number": 7},
        "repository": {"full_name": "octo-org/hello-world"},
        "comment": {"body": body, "user": {"login": login, "id": 583231}},
    }


def _no_id(body: str) -> object:
    """A comment whose author has a login but no numeric id."""
    payload = _commented(body)
    assert isinstance(payload, dict)
    del payload["comment"]["user"]["id"]
    return payload


def test_an_approve_comment_fills_the_form_with_its_key_value_words() -> None:
    found = github.comment_decision(
        "issue_comment", _commented("/approve target=production note=ok ship it\nmore text")
    )
    assert found == github.Decision(
        "octo-org/hello-world",
        7,
        "monalisa",
        "approve",
        {"target": "production", "note": "ok"},
        "ship it",
        583231,
    )
    rejected = github.comment_decision("issue_comment", _commented("  /reject   not yet  "))
    assert isinstance(rejected, github.Decision)
    assert (rejected.choice, rejected.fields, rejected.comment) == ("reject", {}, "not yet")


@pytest.mark.parametrize(
    ("event", "payload", "why"),
    [
        ("issues", _commented("/approve"), "decides nothing"),
        ("issue_comment", _commented("/approve", action="edited"), "only a new comment"),
        ("issue_comment", _commented("please /approve"), "not /approve or /reject"),
        ("issue_comment", _commented("/approved"), "not /approve or /reject"),
        ("issue_comment", _commented(None), "no author"),
        ("issue_comment", _commented("/approve", login=5), "no author"),
        ("issue_comment", _no_id("/approve"), "no author (login and id)"),
        ("issue_comment", _commented("/approve \x00"), "NUL"),
        ("issue_comment", [], "decides nothing"),
    ],
)
def test_what_a_comment_decides_nothing_with(event: str, payload: object, why: str) -> None:
    found = github.comment_decision(event, payload)
    assert isinstance(found, github.Ignored) and why in found.reason


# ---- finished checks: only the repository's own heads --------------------------------------

OURS = {"id": 1296269, "name": "hello-world", "full_name": "octo-org/hello-world"}
FORK = {"id": 999001, "name": "hello-world", "full_name": "mallory/hello-world"}


def _run(event: str, **run: Any) -> dict[str, Any]:
    body = {"head_branch": "feature-1", "head_sha": "a" * 40, "conclusion": "success", **run}
    return {"action": "completed", event: body, "repository": OURS}


def test_a_workflow_run_whose_head_is_the_repositorys_is_checks_completed() -> None:
    found = github.outside_event("workflow_run", _run("workflow_run", head_repository=OURS))
    assert isinstance(found, github.Outside) and found.branch == "feature-1"
    assert found.payload["headRepository"] == "octo-org/hello-world"


def test_a_forks_workflow_run_is_ignored_naming_the_fork() -> None:
    found = github.outside_event("workflow_run", _run("workflow_run", head_repository=FORK))
    assert isinstance(found, Ignored) and "mallory/hello-world" in found.reason


def test_a_workflow_run_that_names_no_head_repository_is_ignored() -> None:
    assert isinstance(github.outside_event("workflow_run", _run("workflow_run")), Ignored)


def test_a_fork_with_the_repositorys_name_is_told_apart_by_its_id() -> None:
    renamed = {**FORK, "full_name": "octo-org/hello-world"}
    found = github.outside_event("workflow_run", _run("workflow_run", head_repository=renamed))
    assert isinstance(found, Ignored)


def test_a_check_suite_whose_pull_request_comes_from_a_fork_is_ignored() -> None:
    pull = {"number": 7, "head": {"ref": "feature-1", "repo": FORK}, "base": {"repo": OURS}}
    found = github.outside_event("check_suite", _run("check_suite", pull_requests=[pull]))
    assert isinstance(found, Ignored) and "mallory/hello-world" in found.reason


def test_a_check_suite_of_the_repositorys_own_branch_is_checks_completed() -> None:
    pull = {"number": 7, "head": {"ref": "feature-1", "repo": OURS}, "base": {"repo": OURS}}
    for pulls in ([], [pull]):
        found = github.outside_event("check_suite", _run("check_suite", pull_requests=pulls))
        assert isinstance(found, github.Outside), pulls


def test_with_fork_heads_allowed_a_forks_run_counts_and_names_its_head() -> None:
    payload = _run("workflow_run", head_repository=FORK)
    found = github.outside_event("workflow_run", payload, fork_heads=True)
    assert isinstance(found, github.Outside)
    assert found.payload["headRepository"] == "mallory/hello-world"


def test_an_approver_known_by_a_github_login_alone_is_refused_naming_github_id() -> None:
    from pydantic import ValidationError

    from fsm_celery.config import Approver

    with pytest.raises(ValidationError, match="github_id"):
        Approver(groups=("release",), github="monalisa")
    assert Approver(groups=("release",), github="monalisa", github_id=2).github_id == 2
