"""`python -m projections`: a value out of range gets argparse's answer (exit 2, the option named), not a
traceback from deep in the projector."""

from __future__ import annotations

import pytest

from projections.projector import DECODE_NICENESS, _parser, main

BASE = ["--bootstrap", "127.0.0.1:1"]
RUN = ["run", "--db", "never-opened.duckdb"]


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("--decode-niceness", "20", "20 is not within 0-19"),
        ("--decode-niceness", "-1", "-1 is not within 0-19"),
        ("--decode-workers", "-1", "-1 is below 0"),
        ("--batch-size", "0", "0 is below 1"),
        ("--batch-size", "many", "not an integer: 'many'"),
    ],
)
def test_a_value_out_of_range_is_refused_by_name(
    option: str, value: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([*BASE, option, value, *RUN])
    assert exit_.value.code == 2
    error = capsys.readouterr().err
    assert option in error and says in error


def test_the_niceness_is_the_projectors_default_unless_given() -> None:
    assert _parser().parse_args([*BASE, *RUN]).decode_niceness == DECODE_NICENESS
    assert _parser().parse_args([*BASE, "--decode-niceness", "0", *RUN]).decode_niceness == 0
