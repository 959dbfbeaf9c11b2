"""A scripted OpenAI-compatible chat endpoint, for the demo and the tests: it answers
`POST /v1/chat/completions` from a script instead of a model, so that the LLM agent
(fsm_celery.agent.llm) can be run end to end with no network and no model.

Each answer is an object with each key the request's schema requires: the script's value for
the state when it has one (`$context.KEY` stands for the context's value), else the context's
value of that key, else a short text. With `bad_first`, the first answer to each (machine,
state, attempt) leaves out the required keys, so the agent's correction turn is exercised; with
`first_status` (429, 503 ...), the first request of all is answered with it and a Retry-After of
`retry_after` seconds. Every request is kept (`requests`) for the tests to look at.

`python -m fsm_celery.agent.scripted_llm [--port 8000]` serves it (broken answers first) at
http://127.0.0.1:PORT/v1, to try `fsm-celery agent --llm` with no model (docs/agents.md).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

# What the research definitions' states answer, by state name (the others: see the module).
DEFAULT_SCRIPT: dict[str, dict[str, Any]] = {
    "PLANNING": {"subQuestions": ["What is it?", "Who uses it, and why?"]},
    "RESEARCH": {"finding": "A finding from the scripted model.", "sources": ["scripted"]},
    "ANALYZING": {"analysis": "The scripted model's analysis.", "taskState": "$context.taskState"},
    "REVIEWING": {"approved": True, "feedback": "Approved.", "taskState": "$context.taskState"},
}
_OPENING = re.compile(r"You work state (\S+) \(attempt (\d+)\) of machine (\S+),")


@dataclass
class Script:
    answers: Mapping[str, Mapping[str, Any]] = field(default_factory=lambda: DEFAULT_SCRIPT)
    bad_first: bool = False
    first_status: int | None = None
    retry_after: float = 1.0
    requests: list[dict[str, Any]] = field(default_factory=list)
    _seen: set[tuple[str, str, str]] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, body: Mapping[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
        """(status, body, headers) for one chat completion request."""
        with self._lock:
            self.requests.append(dict(body))
            if self.first_status is not None and len(self.requests) == 1:
                error = {"error": {"message": f"scripted {self.first_status}", "type": "scripted"}}
                return self.first_status, error, {"retry-after": f"{self.retry_after:g}"}
            messages = body.get("messages") or []
            opening = _OPENING.search(str(messages[0].get("content", ""))) if messages else None
            state, attempt, machine = opening.groups() if opening else ("", "0", "")
            first = (machine, state, attempt) not in self._seen
            self._seen.add((machine, state, attempt))
        schema = (body.get("response_format") or {}).get("json_schema", {}).get("schema", {})
        required = list(schema.get("required", []))
        context = _context(messages)
        if self.bad_first and first and required:
            output: dict[str, Any] = {}
        else:
            script = self.answers.get(state, {})
            output = {key: _value(key, script, context) for key in required}
        content = json.dumps(output)
        prompt_tokens = sum(len(str(m.get("content", ""))) for m in messages) // 4 + 1
        completion_tokens = len(content) // 4 + 1
        return (
            200,
            {
                "id": f"scripted-{len(self.requests)}",
                "object": "chat.completion",
                "created": 0,
                "model": body.get("model", "scripted"),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                },
            },
            {},
        )


def _context(messages: list[Mapping[str, Any]]) -> dict[str, Any]:
    for message in messages:
        text = str(message.get("content", ""))
        _, found, rest = text.partition("Context (JSON):\n")
        if found:
            try:
                value = json.loads(rest)
            except ValueError:
                return {}
            return value if isinstance(value, dict) else {}
    return {}


def _value(key: str, script: Mapping[str, Any], context: Mapping[str, Any]) -> Any:
    if key in script:
        value = script[key]
        if isinstance(value, str) and value.startswith("$context."):
            return context.get(value.removeprefix("$context."))
        return value
    if key in context:
        return context[key]
    return f"{key} from the scripted model"


def make_app(script: Script) -> Any:
    """The endpoint as an ASGI app."""
    app = FastAPI(title="scripted chat model")

    @app.post("/v1/chat/completions")
    async def completions(request: Request) -> JSONResponse:
        status, body, headers = script.answer(await request.json())
        return JSONResponse(body, status_code=status, headers=headers)

    return app


class Served:
    """The endpoint served on a thread (127.0.0.1, a free port), until stopped."""

    def __init__(self, script: Script | None = None, port: int = 0) -> None:
        import socket

        import uvicorn

        self.script = script or Script()
        if port == 0:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/v1"
        config = uvicorn.Config(
            make_app(self.script), host="127.0.0.1", port=port, log_level="warning"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def __enter__(self) -> Served:
        import time

        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the scripted chat endpoint did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *_: object) -> None:
        self._server.should_exit = True
        self._thread.join(5)


def main(argv: list[str] | None = None) -> None:
    """Serve the endpoint until interrupted, each state's first answer broken."""
    import argparse

    import uvicorn

    parser = argparse.ArgumentParser(description="A scripted OpenAI-compatible chat endpoint.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    app = make_app(Script(bad_first=True))
    uvicorn.run(app, host=args.host, port=args.port, log_level="info")


if __name__ == "__main__":
    main()
