"""The outbound side of the agents' protocol: state_tasks, state_cancels and transition events
leave through a Dispatcher (fsm_celery.engine.ports) — Redis in production (channel/redis.py),
memory for the embedded demo (channel/memory.py) — and the Redis ACLs that confine each agent
to its own keys (channel/acl.py); and which errors of the surroundings are worth a retry
(channel/transient.py). What agents send back is fsm_celery.acks's."""
