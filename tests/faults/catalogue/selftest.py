"""Not a fault of the model: the detectors' self-test."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from coroner.core import api
from faults.catalogue.base import Fault, fault
from faults.workers import now_text, register, spawn
from support import kube

if TYPE_CHECKING:
    pass


@fault("selftest")
class SelfTest(Fault):
    """Not a fault of the model: breaks the invariant on purpose (as the cluster admin, who holds
    every verb) so that a test can prove each detector fires. Never drawn by the bench."""

    cluster_wide = True  # it lifts the admission policies for a moment

    def arm(self) -> None:
        plane, ns = self.trial.plane, self.trial.namespace
        live = next(w for w in self.trial.workers if not w.victim and w.registered and w.kind in ("sleep", "pidns"))
        # Admission refuses a retirement without the Dead attestation it names (as it should): the
        # self-test lifts Coroner's admission policies for this one write (read right before it:
        # heartbeats keep moving the resourceVersion).
        with plane.admission_lifted():
            for attempt in range(10):
                body = kube.get_registration(plane.admin, ns, live.name)
                status = body.get("status") or {}
                retirement = {
                    "retiredTime": now_text(),
                    "retiredBy": "kubernetes-admin",
                    "reason": "PidfdExited",
                    "decision": "EligibleStaleOrphan",
                    "attestation": status.get("attestation"),
                }
                try:
                    kube.patch_status(
                        plane.admin,
                        ns,
                        live.name,
                        [
                            {
                                "op": "test",
                                "path": "/metadata/resourceVersion",
                                "value": body["metadata"]["resourceVersion"],
                            },
                            {"op": "add", "path": "/status/retirement", "value": retirement},
                            {"op": "add", "path": "/status/state", "value": "Retired"},  # the CRD's rule
                        ],
                    )
                    break
                except ApiException as exc:
                    if exc.status != 422 or attempt == 9:
                        raise
        for _ in range(2):  # two Retired Events for one object
            event = k8s.CoreV1Event(
                metadata=k8s.V1ObjectMeta(name=f"{live.name}.{uuid.uuid4().hex[:8]}", namespace=ns),
                involved_object=k8s.V1ObjectReference(
                    api_version=api.API_VERSION,
                    kind=api.KIND,
                    name=live.name,
                    namespace=ns,
                    uid=body["metadata"]["uid"],
                ),
                reason="Retired",
                message="selftest",
                type="Normal",
            )
            k8s.CoreV1Api(plane.admin).create_namespaced_event(ns, event)
        # A dead worker on a node no agent serves: it can only stay active.
        self.ghost = self.trial.add(f"ghost-{uuid.uuid4().hex[:6]}", "sleep", victim=True, tag="ghost")
        spawn(self.ghost)
        register(
            self.ghost,
            client=plane.worker_client,
            namespace=ns,
            boot_id_file=plane.agents[self.trial.nodes[0]].boot_file,
        )
