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


def test_the_lease_watch_leaves_out_kube_node_lease_server_side_and_nothing_else() -> None:
    """kopf sends settings.watching.field_selectors with the watch and the list of the resource it
    selects: Leases lose kube-node-lease; nodes and registrations are not filtered at all."""
    from kopf._cogs.structs import references

    settings = kopf.OperatorSettings()
    configure(settings)

    def resource(group: str, version: str, plural: str, kind: str) -> references.Resource:
        return references.Resource(group, version, plural, kind=kind, namespaced=plural != "nodes")

    leases = resource("coordination.k8s.io", "v1", "leases", "Lease")
    assert list(settings.watching.field_selectors.collect(leases)) == ["metadata.namespace!=kube-node-lease"]
    for other in (
        resource("", "v1", "nodes", "Node"),
        resource("coroner.dev", "v1alpha1", "workerregistrations", "WorkerRegistration"),
    ):
        assert list(settings.watching.field_selectors.collect(other)) == []
    assert list(settings.watching.label_selectors.collect(leases)) == [], "a label would miss workers' own Leases"
