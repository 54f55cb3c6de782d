"""The event models' strict shapes: msgspec structs made from the pydantic models, shared by the consumers.

`shape(model)` makes a struct that accepts exactly the JSON objects the model accepts in strict mode
(narrowed further where `FAST_ONLY` says: a supported version, a UUID event_id, a lower-case hex digest).
The projector decodes a message with them in one msgspec call (`projections.decode`); the fold checks each
decoded event with them (`conforms`) instead of validating it into a pydantic model on arrival. Neither
refuses an event on their word alone: what a shape does not accept (or cannot judge: a float, a value nested
deeper than `FAST_PATH_DEPTH`) is judged by the model itself (`preflight.events.decode_event`), which also
names the defect -- so the verdict is the model's, whichever path found it.
"""

from __future__ import annotations

import math
import types
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Final, Literal, Union, get_args, get_origin

import annotated_types
import msgspec
from pydantic import BaseModel

from preflight.events import SUPPORTED_EVENT_VERSIONS, PreflightEvent

__all__ = [
    "EVENT_MODELS",
    "EVENT_SHAPES",
    "FAST_ONLY",
    "FAST_PATH_DEPTH",
    "FLOAT_HOLDERS",
    "UUID_PATTERN",
    "conforms",
    "has_float",
    "plain",
    "shape",
    "too_deep",
]

DIGEST_LENGTH: Final = 64  # hex digits of a SHA-256 digest
UUID_PATTERN: Final = r"[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}"
#: An event's fields the fast shape holds to more than its model does: what the fast path can judge (a
#: supported version, a UUID, a lower-case hex digest, as `hexdigest` spells it). A message outside them
#: is not refused: it takes the reference path, which names the defect.
FAST_ONLY: Final[dict[str, Any]] = {
    "schema_version": Literal[tuple(sorted(SUPPORTED_EVENT_VERSIONS))],
    "event_id": Annotated[str, msgspec.Meta(pattern=rf"^(?:{UUID_PATTERN})\Z")],
    "hash": Annotated[str, msgspec.Meta(pattern=rf"^[0-9a-f]{{{DIGEST_LENGTH}}}\Z")],
}


def plain(annotation: Any) -> Any:
    """`annotation` with every pydantic model in it replaced by its `_shape`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return shape(annotation)
    args = get_args(annotation)
    if not args or not any(plain(arg) is not arg for arg in args):
        return annotation
    origin = get_origin(annotation)
    if origin is Union or origin is types.UnionType:
        return Union[tuple(plain(arg) for arg in args)]  # noqa: UP007 -- built from a tuple
    return origin[tuple(plain(arg) for arg in args)]


def shape(model: type[BaseModel], fast_only: Mapping[str, Any] = FAST_ONLY) -> type[msgspec.Struct]:
    """A msgspec struct that accepts exactly the JSON objects `model` accepts in strict mode: same fields,
    types and constraints, extra keys forbidden, a field with a default optional -- and `UNSET` when it was
    left out, so that it is left out of the dict again (`_as_dicts`) and of the encoding (`_CANONICAL`) --
    but an event's `fast_only` fields, which it holds to more (`FAST_ONLY`: what the fast path can judge).

    msgspec decodes and validates a message in one pass, in C, in less than half the time pydantic's strict
    validation into dicts took on the bench workload (1.4 against 3.6 us an event, in process). Made from
    the model itself, so the two cannot drift apart (a property test compares their verdicts); a
    constraint with no msgspec form stops the import rather than pass unchecked.
    """
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
    event_type = model.model_fields.get("event_type")
    for name, info in model.model_fields.items():
        if info is event_type:  # the union's tag: msgspec checks it is present and names this struct
            continue
        if _typed_float(info.annotation):  # msgspec would read it without `_no_float`, and spell it its way
            raise TypeError(f"{model.__name__}.{name}: a field typed float has no fast form")
        annotation = plain(info.annotation)
        bounds: dict[str, Any] = {}
        for constraint in info.metadata:
            if not isinstance(constraint, annotated_types.Ge):
                raise TypeError(f"{model.__name__}.{name}: no msgspec form for the constraint {constraint!r}")
            bounds["ge"] = constraint.ge
        narrowed = event_type is not None and name in fast_only
        if narrowed:
            annotation = fast_only[name]  # within the model's type and bounds
        elif bounds:
            annotation = Annotated[annotation, msgspec.Meta(**bounds)]
        if info.is_required() or narrowed:  # an event without its schema_version: the reference path judges it
            fields.append((name, annotation))
        else:
            fields.append((name, Union[annotation, msgspec.UnsetType], msgspec.UNSET))  # noqa: UP007
    tag: dict[str, Any] = {} if event_type is None else {"tag_field": "event_type", "tag": event_type.default}
    return msgspec.defstruct(
        f"{model.__name__}Shape", fields, kw_only=True, forbid_unknown_fields=True, frozen=True, **tag
    )


def _typed_float(annotation: Any) -> bool:
    """Whether `annotation` admits a float by type (not only as an Any value); a nested model answers for
    its own fields when its shape is made."""
    if annotation is float:
        return True
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return False
    return any(_typed_float(arg) for arg in get_args(annotation) if not isinstance(arg, str))


EVENT_MODELS: Final = get_args(get_args(PreflightEvent)[0])
EVENT_SHAPES: Final = {model: shape(model) for model in EVENT_MODELS}


def _may_hold_float(annotation: Any) -> bool:
    """Whether a strictly validated field of this type can hold a float (Any can; str, int, bool can't)."""
    if annotation is Any or annotation is float:
        return True
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return any(_may_hold_float(f.annotation) for f in annotation.model_fields.values())
    return any(_may_hold_float(arg) for arg in get_args(annotation) if not isinstance(arg, str))


#: Per event type, the fields that may hold any JSON value, a float or a deep one: the only ones `too_deep`
#: looks into.
FLOAT_HOLDERS: Final = {
    model.model_fields["event_type"].default: tuple(
        name for name, info in model.model_fields.items() if _may_hold_float(info.annotation)
    )
    for model in EVENT_MODELS
}


#: How deep a value may nest for the fast path to judge it. The models refuse what their serializer
#: cannot write back (a few hundred levels); deeper than this, the reference path, which asks them, decides.
FAST_PATH_DEPTH: Final = 64


def too_deep(events: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a value in one of `events` nests deeper than `FAST_PATH_DEPTH`. Only asked of a message
    with more brackets than that: a value cannot nest deeper than the brackets its message holds."""
    for event in events:
        for name in FLOAT_HOLDERS[event["event_type"]]:
            if name in event and has_float(event[name], FAST_PATH_DEPTH):
                return True
    return False


def has_float(value: Any, limit: float = math.inf, depth: int = 1) -> bool:
    """Whether `value` holds a float -- or nests deeper than `limit` (the fast path's question: is this
    beyond what it may judge?)."""
    kind = type(value)
    if kind is float:
        return True
    if kind is dict:
        items: Any = value.values()
    elif kind is list:
        items = value
    else:
        return False
    if depth > limit:
        return True
    for item in items:
        inner = type(item)
        if inner is str or inner is int or inner is bool or item is None:
            continue
        if inner is float or has_float(item, limit, depth + 1):
            return True
    return False


#: Each event type's strict shape.
_BY_TYPE: Final = {model.model_fields["event_type"].default: s for model, s in EVENT_SHAPES.items()}


def conforms(event: Mapping[str, Any], text: str | None = None) -> bool:
    """Whether `event` (decoded JSON) is accepted by its strict shape, hence by its model: True means the
    model would accept it too; False only that the model must judge it (`decode_event`). `text`, the event's
    own JSON, spares the depth check of a short one (a value cannot nest deeper than its brackets)."""
    kind = _BY_TYPE.get(event.get("event_type"))
    if kind is None:
        return False
    if (text is None or text.count("[") + text.count("{") > FAST_PATH_DEPTH) and too_deep([event]):
        return False
    try:
        msgspec.convert(event, kind)
    except msgspec.ValidationError:
        return False
    return True
