"""The inbound side: agents' acks, hand-backs, heartbeats and statuses, from where they arrive
to the transaction that applies them.

- consumer.py: a Consumer hands out Envelopes and finishes them; streams.py (the agents' ack
  streams, durable), pubsub.py (the seed's channel) and memory.py (the demo's, and tests') are
  the three;
- bridge.py: the loop: each consumer read, each batch handled, each message finished, tried
  again or parked;
- dead.py: the one dead-letter policy (when to give up on a message, and why) and the stream
  where given-up messages are parked;
- apply.py: the Applier: a batch in one transaction, a message that breaks it isolated;
- relay.py: the celery mode's hand-off: the bridge's Relay sends each batch as an
  fsm.apply_acks task, which a worker applies (fsm_celery.worker.tasks);
- serve.py: the bridge's processes.

Which handler the bridge uses (apply here, or relay) is the transition mode's choice, read
once from the settings in fsm_celery.wiring.
"""
