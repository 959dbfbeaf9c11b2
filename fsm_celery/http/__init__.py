"""The HTTP API and dashboard (an ASGI app): `fsm-celery dashboard`, or
`uvicorn --factory fsm_celery.http:create_app` under any ASGI server."""

from __future__ import annotations

from fsm_celery.http.app import create_app

__all__ = ["create_app"]
