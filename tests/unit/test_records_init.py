"""The records whose `__init__` is written out (for speed: coroner.core.model.records) take the same
parameters and build the same objects as the `__init__` dataclasses would generate for them.

Each is compared with a reference: a dataclass made by `dataclasses.make_dataclass` from the very
same fields, frozen, slotted and keyword-only like the record, so its `__init__` is the generated one.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coroner.core.decision.known import Known
from coroner.core.model import Condition, Incarnation, Registration

pytestmark = pytest.mark.unit

WRITTEN_OUT = (Incarnation, Condition, Registration, Known)


def reference(cls: type) -> type:
    """`cls` as dataclasses would build it: the same fields, the generated `__init__`."""
    return dataclasses.make_dataclass(
        f"Reference{cls.__name__}",
        [(f.name, f.type, f) for f in dataclasses.fields(cls)],
        frozen=True,
        slots=True,
        kw_only=True,
    )


def _parameters(cls: type) -> list[tuple[str, Any, Any, Any]]:
    return [(p.name, p.kind, p.default, p.annotation) for p in inspect.signature(cls.__init__).parameters.values()]


@pytest.mark.parametrize("cls", WRITTEN_OUT, ids=lambda c: c.__name__)
def test_the_written_out_init_takes_the_generated_ones_parameters(cls: type) -> None:
    assert "__init__" in cls.__dict__ and cls.__init__.__module__ == cls.__module__
    assert _parameters(cls) == _parameters(reference(cls))
    assert cls.__dataclass_params__.frozen  # type: ignore[attr-defined]


# Values of every kind a field could be given (the records do not check types, nor may their inits).
VALUES = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=5), st.tuples(st.integers()))


@pytest.mark.parametrize("cls", WRITTEN_OUT, ids=lambda c: c.__name__)
@given(data=st.data())
def test_the_written_out_init_builds_what_the_generated_one_builds(cls: type, data: st.DataObject) -> None:
    ref = reference(cls)
    fields = dataclasses.fields(cls)
    kwargs = {}
    for f in fields:
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if required or data.draw(st.booleans()):
            kwargs[f.name] = data.draw(VALUES)
    built, expected = cls(**kwargs), ref(**kwargs)
    assert [getattr(built, f.name) for f in fields] == [getattr(expected, f.name) for f in fields]
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(built, fields[0].name, None)


@pytest.mark.parametrize("cls", WRITTEN_OUT, ids=lambda c: c.__name__)
def test_the_written_out_init_refuses_what_the_generated_one_refuses(cls: type) -> None:
    ref = reference(cls)
    required = {
        f.name: None
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        ((), {**required, "unknown_field": 1}),
        ((1,), required),
    ]
    if required:
        calls.append(((), dict(list(required.items())[1:])))
    for args, kwargs in calls:
        with pytest.raises(TypeError) as ours:
            cls(*args, **kwargs)
        with pytest.raises(TypeError) as theirs:
            ref(*args, **kwargs)
        assert str(ours.value).split("()", 1)[1] == str(theirs.value).split("()", 1)[1]
