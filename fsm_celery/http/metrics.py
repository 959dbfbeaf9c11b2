"""GET /metrics: the fleet-wide gauges for Prometheus (fsm_celery.http.fleet), computed when
scraped. Guarded by a bearer token: a viewer's or an admin's (FSM_VIEWER_TOKENS,
FSM_ADMIN_TOKENS), or FSM_METRICS_TOKEN, one for Prometheus alone; never public, whatever
FSM_PUBLIC_READS says (the figures describe the whole deployment). Prometheus passes it as

    authorization:
      credentials: <the token>        # or credentials_file: /run/secrets/fsm-metrics-token

in the scrape job (docs/operations.md)."""

from __future__ import annotations

import hmac
import threading

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from fsm_celery.channel.redis import connect
from fsm_celery.client import Client
from fsm_celery.config import Settings
from fsm_celery.http.auth import Auth, unauthorized
from fsm_celery.http.fleet import Fleet, exposition, fleet
from fsm_celery.metrics.observer import Counting

# what the dashboard's own requests move (operators' commands, outside events): served with
# the fleet's gauges, under its own job
OWN = ("fsm_transitions_total", "fsm_events_total")

router = APIRouter(include_in_schema=False)
_building = threading.Lock()


def _allowed(settings: Settings, auth: Auth, token: str) -> bool:
    dedicated = settings.metrics_token
    if dedicated and hmac.compare_digest(token.encode(), dedicated.encode()):
        return True
    return auth.identify(token) is not None


@router.get("/metrics")
def metrics(request: Request) -> Response:
    """The fleet-wide gauges, in Prometheus's text format."""
    settings: Settings = request.app.state.settings
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise unauthorized("a viewer's, an admin's or FSM_METRICS_TOKEN's bearer token is needed")
    if not _allowed(settings, request.app.state.auth, token.strip()):
        raise unauthorized("invalid token")
    own = generate_latest(REGISTRY.restricted_registry(OWN))
    return Response(exposition(_fleet(request)) + own, media_type=CONTENT_TYPE_LATEST)


def count_requests(client: Client, settings: Settings) -> None:
    """Count what the dashboard's commands and events do (its engine's Observer), unless the
    engine counts already."""
    runtime = client.engine.runtime
    if runtime.observer is None:
        runtime.observer = Counting(settings.transition_mode.value)


def _fleet(request: Request) -> Fleet:
    state = request.app.state
    with _building:
        if getattr(state, "fleet", None) is None:
            state.fleet = fleet(state.settings, state.client.engine.db, connect)
    found: Fleet = state.fleet
    return found
