"""The kopf wiring's one assumption: no change-detecting handlers, so no diff essence is needed."""

from __future__ import annotations

import kopf
import pytest

from coroner_operator.handlers import NoEssenceDiffBaseStorage, Runtime, configure, register

pytestmark = pytest.mark.unit


def test_only_event_handlers_and_indexes_so_the_essence_kopf_would_copy_is_never_used() -> None:
    registry = kopf.OperatorRegistry()
    register(registry, Runtime())
    assert list(registry._changing.get_all_handlers()) == [], "an on.create/update/delete handler needs a real essence"
    assert list(registry._spawning.get_all_handlers()) == [], "a daemon or timer needs a real essence"
    settings = kopf.OperatorSettings()
    configure(settings)
    assert isinstance(settings.persistence.diffbase_storage, NoEssenceDiffBaseStorage)
    assert settings.persistence.diffbase_storage.build(body=kopf.Body({"spec": {"a": 1}})) == {}
