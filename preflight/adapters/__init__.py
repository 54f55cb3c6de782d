"""Adapters for the engine's ports: the only I/O in the package.

Everything else in `preflight` is pure decision code and the event contract; it imports no broker,
stream processor or database. Each adapter lives in its own module and imports its client library only
there, so `import preflight` (or `import preflight.adapters`) never pulls one in:

* `preflight.adapters.kafka` -- `KafkaEventSink`, the agent-side publisher of run events (aiokafka).
* `preflight.adapters.baseline` -- `BaselineStorage`, tier 4's reader of the fold worker's baseline
  view, with read-your-writes from the sink's acknowledged positions (stdlib HTTP only).
"""
