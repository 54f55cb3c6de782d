"""Fixtures of the reliability suite: its own broker (chosen by ``PREFLIGHT_BROKER``), fresh topic names,
the broker a restart test may stop, and the counts every audit printed, repeated in the terminal summary.

The suite starts its own broker, for this package only, so that stopping and restarting it can never
disturb another test's broker; it is always stopped when the package's tests end.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import pytest

from infra.brokers import ENV_VAR, Broker, broker_from_env
from infra.kafka import ApacheKafkaBroker
from tests.reliability.harness import REPORTED, SEED_ENV, SOAK_ENV, kill_cycles


@pytest.fixture(scope="package")
def broker() -> Iterator[Broker]:
    """The running broker of this package's tests; ``.bootstrap_servers`` is its address."""
    with broker_from_env() as running:
        yield running


@pytest.fixture
def restartable_broker(broker: Broker) -> Iterator[ApacheKafkaBroker]:
    """The package's broker when it is Apache Kafka (durable: a restart keeps every topic); skips otherwise.

    Running again at the end of the test whatever the test did to it."""
    if not isinstance(broker, ApacheKafkaBroker):
        pytest.skip(
            f"stopping and restarting the broker needs Apache Kafka ({ENV_VAR}=kafka): the embedded Tansu keeps"
            " everything in memory and loses every topic when it stops"
        )
    try:
        yield broker
    finally:
        if not broker.running:
            broker.start()


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    """A topic name no other test uses (the topic itself is not created)."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", request.node.name).strip("-")[:60]
    return f"rel.{stem}.{uuid.uuid4().hex[:12]}"


def pytest_report_header(config: pytest.Config) -> str:
    return f"reliability: {kill_cycles()} kill cycles per fault test ({SOAK_ENV}); replay a run with {SEED_ENV}"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if REPORTED:
        terminalreporter.write_sep("-", "reliability audits: lost / duplicated / differing")
        for line in REPORTED:
            terminalreporter.write_line(line)
