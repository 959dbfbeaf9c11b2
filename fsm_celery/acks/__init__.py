"""The inbound side: agents' acks, hand-backs, heartbeats and statuses, from where they arrive
to the transaction that applies them.

- consumer.py: a Consumer hands out Envelopes and finishes them; streams.py (the agents' ack
  streams, durable), pubsub.py (the seed's channel) and memory.py (the demo's, and tests') are
  the three;
- bridge.py: the loop: each consumer read, each batch handled, each message finished, handed
  on, tried again or parked;
- dead.py: the stream where given-up messages are parked (when to give up on one, and why,
  is fsm_celery.core.parking's, one policy for every process);
- relay.py: the celery mode's hand-off: the bridge's Relay sends each batch as an
  fsm.apply_acks task, which a worker applies (fsm_celery.worker.tasks);
- settle.py: the celery mode's end: the worker settles (or parks, once) the stream entries it
  applied, and a bridge relays again those nobody settled in time (streams.py);
- serve.py: the bridge's processes.

Which handler the bridge uses (apply here, through the engine's Applier, engine/inbox.py, or
relay) is the transition mode's choice, read once from the settings in fsm_celery.wiring.
"""
