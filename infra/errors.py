"""Named errors of the infra package: one root, :class:`InfraError`, and a subclass per way things fail."""

from __future__ import annotations


class InfraError(Exception):
    """Root of every error raised by the ``infra`` package."""


class ToolNotFoundError(InfraError):
    """A program the broker needs (the Tansu binary, ``java``, ``mvn``) cannot be found."""


class DependencyFetchError(InfraError):
    """Maven could not fetch the Apache Kafka jars."""


class BrokerConfigError(InfraError):
    """The broker selection or its settings are not usable (e.g. a malformed ``PREFLIGHT_BROKER``)."""


class BrokerStateError(InfraError):
    """An operation was asked of a broker in the wrong state (e.g. its address before it started)."""


class BrokerStartError(InfraError):
    """A broker did not come up: its process exited, or it did not answer in time.

    ``log_tail`` holds the last lines of the broker's log, also appended to the message.
    """

    def __init__(self, message: str, log_tail: str = "") -> None:
        self.log_tail = log_tail
        text = f"{message}\n--- broker log tail ---\n{log_tail}" if log_tail else message
        super().__init__(text)


class BrokerStopError(InfraError):
    """A broker process could not be ended, not even by SIGKILL, within the bound."""


class TopicAdminError(InfraError):
    """Creating, deleting or waiting for topics failed."""
