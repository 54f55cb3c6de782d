"""Fixtures for integration tests: one broker per test session (chosen by ``PREFLIGHT_BROKER``), fresh topics.

The broker is started once for the session and always stopped at its end, also when tests fail; a run
that is aborted hard still ends it at interpreter exit (see ``infra._process``).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from infra.brokers import Broker, broker_from_env, create_topics, delete_topics
from infra.postgres import PostgresServer
from projections.dlq import default_dead_letter_topic


@pytest.fixture(scope="session")
def broker() -> Iterator[Broker]:
    """The session's running broker; ``.bootstrap_servers`` is its address."""
    with broker_from_env() as running:
        yield running


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    """A topic name no other test uses (the topic itself is not created)."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", request.node.name).strip("-")[:80]
    return f"it.{stem}.{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def topic(broker: Broker, topic_name: str, request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """A fresh events topic with the requesting module's ``PARTITIONS`` (default 2), deleted afterwards
    with the projector's dead-letter topic (a projector declares that one itself)."""
    partitions: int = getattr(request.module, "PARTITIONS", 2)
    await create_topics(broker.bootstrap_servers, [topic_name], partitions=partitions)
    try:
        yield topic_name
    finally:
        await delete_topics(broker.bootstrap_servers, [topic_name, default_dead_letter_topic(topic_name)])


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A real PostgreSQL server on a loopback port for the session (Debian's package; `make services`)."""
    with PostgresServer() as server:
        yield server
