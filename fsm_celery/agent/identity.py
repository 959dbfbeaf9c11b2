"""An agent's id: the one it is given, else the one its Redis credentials were issued to
(`fsm-celery agents credentials`), else a new one."""

from __future__ import annotations

import uuid
from urllib.parse import unquote, urlsplit

from fsm_celery.channel.acl import USER_PREFIX


def agent_id(given: uuid.UUID | str | None, redis_url: str) -> str:
    """The agent's id: the one given, else the one its credentials were issued to, else a new
    one; ValueError when the one given is not the credentials' (Redis would refuse its keys)."""
    user = unquote(urlsplit(redis_url).username or "")
    issued = None
    if user.startswith(USER_PREFIX):
        issued = _uuid(user.removeprefix(USER_PREFIX), "the Redis URL's user")
    found = _uuid(given, "agent_id") if given else issued or uuid.uuid4()
    if issued is not None and found != issued:
        raise ValueError(
            f"agent_id: the Redis URL's credentials were issued to agent {issued}, not {found} "
            "(leave agent_id out: it is read from them)"
        )
    return str(found)


def _uuid(value: object, what: str) -> uuid.UUID:
    try:
        return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))
    except ValueError:
        raise ValueError(f"{what}: expected an agent's UUID, got {value!r}") from None
