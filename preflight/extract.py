"""A ready tier-1 hook for proposals: the model points at the user's words, the value is read from them.

`proposal_extractor` is an `extract_from_instruction` hook an adopter can use as it is (SPEC §2.6). For a
field the model proposed a value for, it looks for that value in the user's **trusted** segments
(`preflight.normalise.find_span`: ``500,000``, ``500 000`` and ``500000`` for an integer, case for an
enum value or where the schema makes it irrelevant, an ISO date written out) and, where it finds it as a
whole token, returns the span as evidence. It never accepts a match inside untrusted text (a forwarded
mail, a tool's output) or inside a longer token (``12`` inside ``2200119``), and it returns nothing for a
value the user did not write: that field goes on to the lower tiers, and is asked if none has it. The
engine checks the claim again, as it checks every tier-1 claim.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from preflight.arguments import pointer_of, value_at
from preflight.hooks import MISSING, LookupContext, read
from preflight.normalise import find_span

__all__ = ["proposal_extractor"]


def proposal_extractor(field: str, instruction: Any, ctx: LookupContext | None = None) -> dict[str, Any] | None:
    """`{value, segment_index, span}` for the proposed value of `field` where the user wrote it, or None."""
    if ctx is None or isinstance(instruction, str) or not isinstance(ctx.proposed_arguments, Mapping):
        return None
    proposed = value_at(ctx.proposed_arguments, pointer_of(field))
    if proposed is MISSING:
        return None
    schema = ctx.field_schemas.get(field)
    for index, segment in enumerate(instruction):
        text = read(segment, "text", None)
        if read(segment, "trust", None) != "user" or not isinstance(text, str):
            continue
        span = find_span(text, proposed, schema if isinstance(schema, Mapping) else None)
        if span is not None:
            return {"value": proposed, "segment_index": index, "span": list(span)}
    return None
