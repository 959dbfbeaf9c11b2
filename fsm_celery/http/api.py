"""The HTTP API under /api: machines (and the children, trees and fan-outs of those that fan
out: http/machines.py), approval gates and outside events (http/waits.py), agents, definitions,
statistics, schedules, rejected messages and the live feed (http/system.py). Reads need a viewer
(or public reads); everything that acts needs an admin, and records who and why. Each route is
one call of the Python client; what the routes take is in http/deps.py, their pages in
http/paging.py."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from fsm_celery.http import machines, system, waits
from fsm_celery.http.deps import whole_machine_id

router = APIRouter(prefix="/api", dependencies=[Depends(whole_machine_id)])
for _part in (machines, waits, system):
    router.include_router(_part.router)
