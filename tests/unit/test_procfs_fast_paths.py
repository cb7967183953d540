"""parse_stat's one-match check of the integer fields passes only what its field-by-field check
(the one that names the bad field) passes (coroner.core.procfs)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coroner.core import procfs

pytestmark = pytest.mark.unit

PIECES = st.sampled_from(["0", "1", "9", "-", " ", "  ", "a", "S", "\t", "\n", "-5", "12345678901234567890", "1" * 21])


@given(pieces=st.lists(PIECES, max_size=14))
def test_the_one_match_check_passes_only_what_the_field_check_passes(pieces: list[str]) -> None:
    rest = " " + "".join(pieces)
    fields = rest[1:].split(" ")
    if procfs._STAT_INTEGERS.fullmatch(rest, 1):
        assert procfs._STAT_STATE == 0
        assert all(procfs._SIGNED.fullmatch(field) for field in fields[1:])


@pytest.mark.parametrize(
    ("rest", "passes"),
    [
        (" S 1 2 -3", True),
        (" S", True),
        (" S 1  2", False),  # an empty field
        (" S 1 x", False),
        (" S 1 2 ", False),  # a trailing empty field
        (" S 1 " + "1" * 21, False),
    ],
)
def test_the_one_match_check_table(rest: str, passes: bool) -> None:
    assert bool(procfs._STAT_INTEGERS.fullmatch(rest, 1)) is passes
