"""The run's wrapper (`Preflight.run_and_record`, `_run`, `_ids`): its shortcuts for the usual input give what the
general path gives."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from preflight import MemoryEventSink, MemoryStorage, create_preflight
from preflight import scenario as sc
from preflight.api import _ids


class Text(str):
    """A subclass of `str`: an id the general path keeps."""


_MISSING = object()
ID_VALUES = st.one_of(
    st.just(_MISSING),
    st.none(),
    st.text(max_size=8),
    st.text(max_size=8).map(Text),
    st.integers(),
    st.lists(st.text(max_size=2), max_size=2),
)


@given(user=ID_VALUES, agent=ID_VALUES, other=st.dictionaries(st.text(max_size=4), st.integers(), max_size=3))
def test_a_dicts_ids_are_what_any_mapping_gives(user: Any, agent: Any, other: dict[str, Any]) -> None:
    raw = {k: v for k, v in other.items() if k not in ("user_id", "agent_id")}
    if user is not _MISSING:
        raw["user_id"] = user
    if agent is not _MISSING:
        raw["agent_id"] = agent
    got = _ids(raw)
    assert got == _ids(MappingProxyType(raw))  # not a dict: the general path, by `Mapping`
    assert all(type(a) is type(b) for a, b in zip(got, _ids(MappingProxyType(raw)), strict=True))


def test_a_validated_inputs_ids_are_its_members() -> None:
    from preflight.inputs import PreflightInput

    raw = {**sc.transfer(user_answers=sc.READY_ANSWERS), "agent_id": "agent_7"}
    assert _ids(PreflightInput.model_validate(raw)) == _ids(raw) == (raw["user_id"], "agent_7")
    assert _ids(["not", "a", "mapping"]) == (None, None)


async def test_run_and_record_is_run_then_record() -> None:
    raw = sc.transfer(user_answers=sc.READY_ANSWERS)
    by_pair, by_parts = MemoryStorage(), MemoryStorage()
    one = create_preflight(hooks=sc.hooks(), storage=by_pair, sink=MemoryEventSink())
    two = create_preflight(hooks=sc.hooks(), storage=by_parts, sink=MemoryEventSink())
    paired = await one.run_and_record(raw)
    parted = await two.record(await two.run(raw))
    assert paired.execution_decision == parted.execution_decision == "execute"
    assert [e.event_type for e in paired.run_events] == [e.event_type for e in parted.run_events]
    assert [r.execution_decision for r in by_pair.history(paired.storage_key)] == ["execute"]
    assert by_pair.history(paired.storage_key) == [paired]
    assert by_parts.history(parted.storage_key) == [parted]
