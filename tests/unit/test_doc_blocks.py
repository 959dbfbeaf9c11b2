"""Every YAML and shell block in README.md and docs/*.md is one the code accepts.

A newcomer copies the docs; an example the code refuses is a trap. For each file, the fenced
blocks are extracted and checked without running anything:

- ```yaml / ```yml: must parse. A definition (`type:` and `states:`), a state or a list of
  states (`- name: ...`), or a part of a definition (its top-level keys: `schedules:`,
  `context_schema:`, `notify:` ...) is completed into a minimal definition and loaded by the
  definition loader, static checks included:
    - a state list runs from its first state; each target it names that it does not define is
      added as a terminal state (`FAILED` fails, any other completes);
    - `states: [...]` in a fan-out's body is elided: it stands for one terminal state named
      by the body's `initial_state`.
  A block whose first line is `# illustrative` is only parsed (a sketch, not an example to copy).
- ```sh / ```bash / ```shell / ```console (in console blocks, the lines after `$ `): each
  command (lines joined at a trailing backslash; split at ; && || | &) is checked by its
  first word, after `VAR=value` prefixes and `sudo -u USER`:
    - `fsm-celery ...` is parsed by the CLI's own click parser (types, choices, arity; its
      callbacks that read the database are not run). A word in capitals (ID, MACHINE_ID) or
      ending in `…` is a placeholder for a machine's or agent's id;
    - `make X` names a target of the Makefile;
    - `celery -A fsm_celery X` names a Celery subcommand (flower's plugin included);
    - `python -m X` (python3, .venv/bin/python) names a module that exists;
    - any other command must be in ALLOWED below.
Failures name the file, the line and what was wrong.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import pytest

from fsm_celery.core.definition import MachineDefinition, StateDefinition
from fsm_celery.core.loader import parse_definition, read_yaml
from fsm_celery.exceptions import DefinitionError

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
YAML = ("yaml", "yml")
SHELL = ("sh", "bash", "shell", "console")
ILLUSTRATIVE = "# illustrative"
# Commands a doc may name besides fsm-celery, make, celery and python: the system's and the
# servers' own tools a deployment uses, and the shell's own words (those that lead into a
# command, as `then cmd`, are skipped and the command after them checked).
LEADING = frozenset({"do", "then", "else", "elif", "if", "while", "until", "!", "time", "env"})
ALLOWED = frozenset(
    {".", "source", "export", "cd", "for", "case", "esac", "done", "fi", "{", "}", "set"}
    | {"trap", "wait", "exit", "true", "false", "test", "[", "read", "unset", "exec", "nohup"}
    | {"echo", "printf", "cat", "head", "tail", "grep", "sed", "awk", "tr", "wc", "sleep"}
    | {"ls", "mkdir", "chmod", "tee", "xargs", "ps", "kill", "pkill", "date", "watch", "less"}
    | {"curl", "openssl", "base64", "sha256sum", "jq", "xxd", "tar", "gzip", "zcat", "ssh"}
    | {"pip", "pipx", "uv", "git", "pytest", "ruff", "mypy", "apt-get", "brew", "systemctl"}
    | {"docker", "docker-compose", "redis-cli", "redis-server", "psql", "createuser"}
    | {"createdb", "initdb", "pg_ctl", "postgres", "pgbouncer", "node"}
    | {"promtool", "prometheus"}
)
PYTHONS = frozenset({"python", "python3"})
SAMPLE_ID = "6b0d1c9e-2f4a-4c39-9d5e-8a7b6c5d4e3f"
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$|…$")
MINIMAL = {
    "type": "doc_example",
    "agent_type": "cto",
    "initial_state": "DONE",
    "states": [{"name": "DONE", "terminal": "completed"}],
}


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of its first line of content, counted from 1
    language: str
    text: str

    @property
    def file(self) -> str:
        return str(self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path)

    def where(self, offset: int = 0) -> str:
        return f"{self.file}:{self.line + offset}"


def blocks(path: Path) -> Iterator[Block]:
    """The fenced blocks of a Markdown file, with their language and first line."""
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        opened = re.match(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)", lines[i])
        if opened is None:
            i += 1
            continue
        indent, fence, language = opened.groups()
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i].removeprefix(indent))
            i += 1
        yield Block(path, i - len(body) + 1, language.lower(), "\n".join(body))
        i += 1


# -- YAML ---------------------------------------------------------------------------------------

STATE_FIELDS = frozenset(StateDefinition.model_fields) - {"name"}
DEFINITION_FIELDS = frozenset(MachineDefinition.model_fields)
EDGE_FIELDS = ("on_success", "on_failure", "on_approve", "on_reject", "on_event")


def yaml_problems(block: Block) -> Iterator[str]:
    try:
        data = read_yaml(block.text, block.file)
    except DefinitionError as exc:
        for problem in exc.problems:  # its line, within the block
            yield f"{block.where((problem.line or 1) - 1)}: {problem.message}"
        return
    if block.text.lstrip().startswith(ILLUSTRATIVE):
        return
    definition = as_definition(data)
    if definition is None:
        return
    try:
        parse_definition(elided(definition), block.where())
    except DefinitionError as exc:
        yield from (str(problem) for problem in exc.problems)


def as_definition(data: Any) -> dict[str, Any] | None:
    """The minimal definition a block is part of, or None when it is no part of one."""
    if isinstance(data, list) and data and all(isinstance(s, dict) and "name" in s for s in data):
        return with_states(data)
    if not isinstance(data, dict):
        return None
    if "states" in data and "type" in data:
        return data
    if data.keys() & (DEFINITION_FIELDS - STATE_FIELDS):
        return {**MINIMAL, **data}
    if "name" in data and STATE_FIELDS & data.keys():
        return with_states([data])
    if data and data.keys() <= STATE_FIELDS:  # a state's fields, without its name
        return with_states([{"name": "STEP", **ways_out(data), **data}])
    return None


def ways_out(state: dict[str, Any]) -> dict[str, Any]:
    """The edges a state's fields shown alone leave out, for its kind."""
    if "terminal" in state:
        return {}
    if "approval" in state:
        return {"on_approve": "DONE", "on_reject": "FAILED"}
    if "wait" in state:
        return {"on_event": "DONE", "on_timeout": "FAILED"}
    return {"on_success": "DONE", "on_failure": "FAILED"}


def with_states(states: list[dict[str, Any]]) -> dict[str, Any]:
    """A definition of the states, from the first, each target they name but lack made
    terminal (and FAILED, where an exhausted loop goes)."""
    defined = {s["name"] for s in states}
    stubs = [
        {"name": name, "terminal": "failed" if name == "FAILED" else "completed"}
        for name in dict.fromkeys([*(t for s in states for t in targets(s)), "FAILED"])
        if name not in defined
    ]
    first = states[0]["name"]
    return {
        "type": "doc_example",
        "agent_type": "cto",
        "initial_state": first,
        "states": [
            *states,
            *stubs,
        ],
    }


def targets(state: dict[str, Any]) -> Iterator[str]:
    for field in EDGE_FIELDS:
        edges = state.get(field)
        for edge in edges if isinstance(edges, list) else [edges]:
            if isinstance(edge, str):
                yield edge
            elif isinstance(edge, dict) and isinstance(edge.get("target"), str):
                yield edge["target"]
    if state.get("on_timeout") not in (None, "approve", "reject"):
        yield str(state["on_timeout"])


def elided(data: Any) -> Any:
    """`states: [...]` in a body: one terminal state, its initial_state."""
    if isinstance(data, list):
        return [elided(item) for item in data]
    if not isinstance(data, dict):
        return data
    out = {key: elided(value) for key, value in data.items()}
    if out.get("states") == ["..."]:
        out["states"] = [{"name": out.get("initial_state", "DONE"), "terminal": "completed"}]
    return out


# -- shell --------------------------------------------------------------------------------------


def commands(block: Block) -> Iterator[tuple[int, str]]:
    """Each logical line (line offset, text): continuations joined, quotes closed, a here
    document's lines left out (they are its input, not commands)."""
    lines = block.text.splitlines()
    if block.language == "console":
        lines = [line[2:] if line.startswith("$ ") else "" for line in lines]
    start, pending, heredoc = 0, "", None
    for i, line in enumerate(lines):
        if heredoc is not None:
            heredoc = None if line.strip() == heredoc else heredoc
            continue
        if not pending:
            start = i
        pending += line
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        try:
            shlex.split(pending, comments=True)
        except ValueError:  # a quotation that goes on over the next line
            pending += "\n"
            continue
        if pending.strip():
            yield start, pending
        opened = re.search(r"<<-?\s*['\"]?(\w+)['\"]?", pending)
        heredoc = opened.group(1) if opened else None
        pending = ""
    if pending.strip():
        yield start, pending


def without_substitutions(text: str) -> str:
    """`$(...)` replaced by a word: what it prints is not the doc's command."""
    out, i, quote = [], 0, ""
    while i < len(text):
        char = text[i]
        if quote != "'" and text.startswith("$(", i):
            depth, j = 1, i + 2
            while j < len(text) and depth:
                depth += {"(": 1, ")": -1}.get(text[j], 0)
                j += 1
            out.append("SUBSTITUTED")
            i = j
            continue
        if char in "'\"" and quote in ("", char):
            quote = "" if quote else char
        out.append(char)
        i += 1
    return "".join(out)


def simple_commands(line: str) -> Iterator[list[str]]:
    """The words of each command of a line, without redirections and separators."""
    text = re.sub(r"(?<![\w-])\d(?=>)", "", without_substitutions(line))
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|<>()")
    lexer.whitespace_split = True
    words: list[str] = []
    redirect = False
    for token in lexer:
        if token and set(token) <= set(";&|()"):
            if words:
                yield words
            words = []
        elif token and set(token) <= set("<>&"):
            redirect = True
        elif redirect:
            redirect = False
        else:
            words.append(token)
    if words:
        yield words


def command_words(words: list[str]) -> list[str]:
    """The command a line runs: without `VAR=value`, `sudo -u USER`, `env`, and the shell's
    keywords that lead into a command (`then cmd`, `do cmd`)."""
    while words:
        if re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]) or words[0] in LEADING:
            words = words[1:]
        elif words[0] == "sudo":
            words = words[3:] if words[1:2] == ["-u"] else words[1:]
        else:
            break
    if words and words[0].startswith((".venv/bin/", "$VENV/bin/")):
        words = [words[0].rsplit("/", 1)[1], *words[1:]]
    return words


def command_problem(words: list[str]) -> str | None:
    words = command_words(words)
    if not words:
        return None
    name, args = words[0], words[1:]
    if name == "fsm-celery":
        return fsm_celery_problem(args)
    if name == "make":
        return make_problem(args)
    if name == "celery":
        return celery_problem(args)
    if name in PYTHONS:
        return python_problem(args)
    if name not in ALLOWED:
        return f"command {name!r} is not one the docs may use (tests/unit/test_doc_blocks.py)"
    return None


def fsm_celery_problem(args: list[str]) -> str | None:
    from fsm_celery.cli import main

    args = [SAMPLE_ID if PLACEHOLDER.search(a) else a for a in args]
    try:
        parse_only(main, args)
    except click.ClickException as exc:
        return f"fsm-celery {shlex.join(args)}: {exc.format_message()}"
    except click.exceptions.Exit:  # --help, --version: they print and end
        pass
    return None


def parse_only(
    command: click.Command, args: list[str], parent: click.Context | None = None
) -> None:
    """Parse the arguments as the CLI would, down its groups, running none of it."""
    kept = {p: p.callback for p in command.params}
    for param in command.params:  # they read the database; a JSON option's stays
        if param.callback is not None and "json" not in param.callback.__name__:
            param.callback = None
    try:
        with command.make_context(command.name or "fsm-celery", list(args), parent=parent) as ctx:
            with warnings.catch_warnings():  # Click 9 moves them all into args
                warnings.simplefilter("ignore", DeprecationWarning)
                rest = [*ctx.protected_args, *ctx.args]
            if isinstance(command, click.Group) and rest:
                name, sub, rest = command.resolve_command(ctx, rest)
                assert sub is not None, name
                parse_only(sub, rest, ctx)
    finally:
        for param, callback in kept.items():
            param.callback = callback


def make_problem(args: list[str]) -> str | None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    known = set(re.findall(r"^([\w-]+)\s*:", makefile, re.MULTILINE))
    unknown = [a for a in args if not a.startswith("-") and "=" not in a and a not in known]
    return f"make {' '.join(unknown)}: no such target in Makefile" if unknown else None


def celery_problem(args: list[str]) -> str | None:
    from celery.bin.celery import celery

    if args[:1] == ["--app=fsm_celery"]:
        args = ["-A", "fsm_celery", *args[1:]]
    if args[:1] == ["--app"]:
        args = ["-A", *args[1:]]
    if args[:2] != ["-A", "fsm_celery"]:
        return f"celery {shlex.join(args)}: the app is -A fsm_celery"
    if len(args) < 3 or args[2] not in celery.commands:  # type: ignore[attr-defined]
        return f"celery {shlex.join(args)}: no such Celery subcommand"
    return None


def python_problem(args: list[str]) -> str | None:
    if args[:1] != ["-m"] or len(args) < 2:
        return None
    if importlib.util.find_spec(args[1]) is None:
        return f"python -m {args[1]}: no such module"
    return None


def shell_problems(block: Block) -> Iterator[str]:
    for offset, line in commands(block):
        try:
            found = list(simple_commands(line))
        except ValueError as exc:
            yield f"{block.where(offset)}: cannot split {line!r}: {exc}"
            continue
        for words in found:
            problem = command_problem(words)
            if problem is not None:
                yield f"{block.where(offset)}: {problem}"


# -- the test -----------------------------------------------------------------------------------


def problems(path: Path) -> list[str]:
    found: list[str] = []
    for block in blocks(path):
        if block.language in YAML:
            found.extend(yaml_problems(block))
        elif block.language in SHELL:
            found.extend(shell_problems(block))
    return found


@pytest.mark.parametrize("path", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_every_yaml_and_shell_block_is_one_the_code_accepts(path: Path) -> None:
    found = problems(path)
    assert not found, "\n".join(found)


def test_a_wrong_block_is_named_by_its_file_line_and_fault(tmp_path: Path) -> None:
    doc = tmp_path / "wrong.md"
    doc.write_text(
        "Text.\n\n```yaml\n- name: WORK\n  timeout: an hour\n  on_success: DONE\n"
        "  on_failure: FAILED\n```\n\n```sh\nfsm-celery start --nope x  # a comment\n"
        "make nothing\ncelery -A fsm_celery sprint\nif true; then frobnicate --now; fi\n"
        "cat <<'EOF'\nnot a command\nEOF\n```\n\n```yaml\ntimeout: 2 hours\n```\n",
        encoding="utf-8",
    )
    found = problems(doc)
    assert len(found) == 6, found
    assert found[0].startswith(f"{doc}:4: state WORK: field timeout: ")
    assert f"{doc}:11: fsm-celery start --nope x: No such option" in found[1]
    assert found[2:5] == [
        f"{doc}:12: make nothing: no such target in Makefile",
        f"{doc}:13: celery -A fsm_celery sprint: no such Celery subcommand",
        f"{doc}:14: command 'frobnicate' is not one the docs may use "
        "(tests/unit/test_doc_blocks.py)",
    ]
    assert found[5].startswith(f"{doc}:21: state STEP: field timeout: ")
