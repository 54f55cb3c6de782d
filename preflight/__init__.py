"""preflight: decide before an agent's irreversible tool call, and record every step as an event.

The engine asks fixed questions, looks every argument up in defined sources (never generates one),
decides `execute`, `ask_user`, `hold` or `deferred`, and emits each step as an immutable, hash-chained
event. This package holds pure decisions and the event contract; it imports no broker or database.
"""

from preflight.adapters.keystore import FileKeyStore
from preflight.admission import AdmissionResult, assess_tool_invocation
from preflight.api import ExecutionOutcome, Preflight, create_preflight
from preflight.emit import rebuild_record
from preflight.errors import (
    ChainError,
    ConstructionError,
    EventDecodeError,
    PreflightError,
    RecordingError,
    SigningKeyError,
)
from preflight.events import PreflightEvent, decode_event, encode_event, verify_run
from preflight.hooks import LookupContext
from preflight.inputs import PreflightInput, Segment, Tool
from preflight.protect import ProtectionError, ValueErased, ValueProtector
from preflight.records import UNKEYED_RECORD_KEY, ExecutionRecord, FieldRecord
from preflight.reversibility import effect_class_of
from preflight.signing import DecisionSigner, DecisionVerifier, SignedDecision
from preflight.testing import MemoryEventSink, MemoryKeyStore, MemoryStorage

__all__ = [
    "UNKEYED_RECORD_KEY",
    "AdmissionResult",
    "ChainError",
    "ConstructionError",
    "DecisionSigner",
    "DecisionVerifier",
    "EventDecodeError",
    "ExecutionOutcome",
    "ExecutionRecord",
    "FieldRecord",
    "FileKeyStore",
    "LookupContext",
    "MemoryEventSink",
    "MemoryKeyStore",
    "MemoryStorage",
    "Preflight",
    "PreflightError",
    "PreflightEvent",
    "PreflightInput",
    "ProtectionError",
    "RecordingError",
    "Segment",
    "SignedDecision",
    "SigningKeyError",
    "Tool",
    "ValueErased",
    "ValueProtector",
    "assess_tool_invocation",
    "create_preflight",
    "decode_event",
    "effect_class_of",
    "encode_event",
    "rebuild_record",
    "verify_run",
]
