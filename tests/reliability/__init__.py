"""The reliability suite (issue 5): faults injected into real processes, and bad input.

* ``test_kill_worker`` / ``test_kill_projector``: SIGKILL the Faust worker, then the projector, at
  random points while agents publish (``PREFLIGHT_SOAK_CYCLES`` cycles each, 20 by default; ``make
  soak`` runs 50); ``PREFLIGHT_FAULT_SEED`` replays the kill points of a run.
  ``test_kill_projector`` also stops the projector with SIGTERM to its whole process group (its decode
  workers included), as a service manager or Ctrl-C does: every stop exits cleanly, nothing is lost.
* ``test_broker_restart`` / ``test_publisher_restart``: stop and restart the Apache Kafka broker
  mid-stream (``PREFLIGHT_BROKER=kafka``; skipped on the memory-only Tansu).
* ``test_bad_input``: every kind of bad message dead-lettered by both consumers, nothing else disturbed;
  ``test_fuzz_inputs``: hypothesis on the consumers' decoders and the engine's inputs.
* ``test_audit``: the set-equality audit (``harness``) counts every injected fault.

Each audit prints its counts (lost / duplicated / differing), and the terminal summary repeats them.
Tests that need a broker are marked ``integration`` as well as ``reliability``.
"""
