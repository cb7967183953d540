"""The cache's shortcuts answer as the code they stand for (coroner.core.world)."""

from __future__ import annotations

import dataclasses
import datetime
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coroner.core.decision import AgentFacts
from coroner.core.world import _same_but_renew_time

pytestmark = pytest.mark.unit

NAN = math.nan
TIMES = st.one_of(st.none(), st.datetimes(timezones=st.just(datetime.UTC)))
IDS = st.one_of(st.none(), st.sampled_from(["a", "b", ""]))
DURATIONS = st.one_of(st.none(), st.sampled_from([0, 1, 30, 30.0, NAN, math.inf, True]), st.integers(1, 100))
FACTS = st.builds(AgentFacts, boot_id=IDS, host_id=IDS, renew_time=TIMES, lease_duration_seconds=DURATIONS)


def test_the_shortcut_compares_every_field_but_renew_time() -> None:
    # A field added to AgentFacts must be added to _same_but_renew_time too.
    assert [f.name for f in dataclasses.fields(AgentFacts)] == [
        "boot_id",
        "host_id",
        "renew_time",
        "lease_duration_seconds",
    ]


@given(old=FACTS, new=FACTS, share=st.booleans())
def test_same_but_renew_time_is_the_replace_equality(old: AgentFacts, new: AgentFacts, share: bool) -> None:
    if share:  # the same objects in both (a NaN equals itself only as the same object, as in a tuple)
        new = dataclasses.replace(new, lease_duration_seconds=old.lease_duration_seconds)
    assert _same_but_renew_time(old, new) == (dataclasses.replace(old, renew_time=new.renew_time) == new)
