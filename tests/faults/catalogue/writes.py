"""Writes that race or that admission must refuse: heartbeats after the death, another node's agent\nidentity, the worker identity, malformed objects."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kubernetes import client as k8s

from coroner.core import api
from coroner_dev import fleet
from faults.catalogue.base import Fault, fault
from faults.plane import LEASE_SECONDS, Plane
from faults.workers import Worker, heartbeat, now_text
from support import components, kube

if TYPE_CHECKING:
    pass


@fault("heartbeat_race")
class HeartbeatRace(Fault):
    """Heartbeats still landing after the death, racing the attestation and the retirement; one
    worker is a real `coroner run` launcher whose own heartbeat thread races its child's death."""

    def plan(self) -> None:
        self.racer = self.trial.add(
            self.trial.rng.choice(self.trial.nodes), "sleep", victim=True, tag="racer", generic=False, interval=1, ttl=3
        )
        self.launched = self.trial.add(
            self.trial.rng.choice(self.trial.nodes),
            "launcher",
            victim=True,
            tag="launcher",
            generic=False,
            interval=1,
            ttl=3,
        )

    def strike(self) -> None:
        self.racer.kill()
        self.launched.kill()
        trial = self.trial
        racer = self.racer

        def race() -> None:
            for _ in range(self.rng.randint(1, 5)):
                time.sleep(self.rng.uniform(0.0, 0.4))
                with contextlib.suppress(Exception):
                    heartbeat(racer, client=trial.plane.worker_client, namespace=trial.namespace)
            self.last_beat = time.time()

        self.last_beat = time.time()
        self.thread = threading.Thread(target=race, daemon=True)
        self.thread.start()

    def after(self) -> None:
        self.thread.join(timeout=10)

    def verify(self) -> None:
        self.facts["racing_heartbeats"] = len(self.racer.heartbeats)
        self.facts["reasons_seen"] = sorted(set(self.racer.reasons_seen))


@fault("foreign_attestation")
class ForeignAttestation(Fault):
    """Node A's agent identity speaking for node B: a misconfigured real agent process
    (--node-name B with A's node-bound token), and direct writes with A's token."""

    node_local = True  # self.node is B, the victim node; A is another node

    def plan(self) -> None:
        others = [n for n in self.trial.plane.agents if n != self.node]
        self.source = self.rng.choice(others)
        self.variant = "rogue-agent+direct"
        self.trial.add(self.node, "sleep", victim=False, tag="foreign-target", generic=False)

    def arm(self) -> None:
        plane = self.trial.plane
        source = plane.agents[self.source]
        self.pod = f"rogue-{self.source}-as-{self.node}"
        self.rogue_log = plane.work / f"{self.pod}.log"
        argv = fleet.agent_argv(
            kubeconfig=source.token,
            node=self.node,
            boot_id_file=source.boot_file,
            extra=(
                "--resync-seconds=2",
                f"--lease-duration-seconds={LEASE_SECONDS}",
                "--renew-seconds=1",
                # Stopped in heal: without this it drains on SIGTERM, waiting for node B's live
                # workers until stop() gives up (30 s of every trial); its drain is not the fault.
                "--shutdown-grace-seconds=0",
            ),
        )
        self.rogue = fleet.spawn(argv, log=self.rogue_log, env={"POD_NAME": self.pod})
        self.trial.rogue_pods.add(self.pod)
        refused, accepted = self.trial.refusals(self._attempts(plane))
        self.facts.update(refused=refused, accepted=accepted, lease_holders=[])
        # Let the misconfigured agent run until it has tried both: attesting node B's registrations
        # and renewing node B's agent Lease (refused by coroner-agent-renews-own-lease-only since
        # finding 2 was fixed; before, it took the Lease over, and this waited for that).
        lease_name = f"{api.AGENT_LEASE_PREFIX}{self.node}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                holder = (
                    k8s.CoordinationV1Api(plane.admin)
                    .read_namespaced_lease(lease_name, api.SYSTEM_NAMESPACE)
                    .spec.holder_identity
                )
                if holder not in self.facts["lease_holders"]:
                    self.facts["lease_holders"].append(holder)
            log = self.rogue_log.read_text(errors="replace")
            if "attest failed" in log and ("lease renewal failed" in log or self.pod in self.facts["lease_holders"]):
                break
            time.sleep(0.2)

    def _attempts(self, plane: Plane) -> list[tuple[str, Callable[[], Any]]]:
        target = next(w for w in self.trial.workers if w.node == self.node and w.registered)
        own = next((w for w in self.trial.workers if w.node == self.source and w.registered), None)
        client = plane.agent_client(self.source)
        ns = self.trial.namespace
        body = kube.get_registration(plane.admin, ns, target.name)
        forged = components.attestation(body, verdict="Dead", evidence="ProcAbsent", node=self.node)
        forged["agent"]["podName"] = self.pod
        attempts: list[tuple[str, Callable[[], Any]]] = [
            (
                "attest another node (merge)",
                lambda: kube.patch_status(client, ns, target.name, {"status": {"attestation": forged}}),
            ),
            (
                "attest another node (json)",
                lambda: kube.patch_status(
                    client, ns, target.name, [{"op": "add", "path": "/status/attestation", "value": forged}]
                ),
            ),
        ]
        if own is not None:
            attempts += [
                (
                    "agent writes a heartbeat",
                    lambda: kube.patch_status(client, ns, own.name, {"status": {"lastHeartbeatTime": now_text()}}),
                ),
                (
                    "agent writes a retirement",
                    lambda: kube.patch_status(
                        client,
                        ns,
                        own.name,
                        {
                            "status": {
                                "retirement": {"retiredTime": now_text(), "retiredBy": "agent", "reason": "ProcAbsent"},
                                "state": "Retired",  # as a retirement must (the CRD): refused by admission
                            }
                        },
                    ),
                ),
            ]
        return attempts

    def disturbs(self, w: Worker) -> bool:
        return self.on_node(w)  # the rogue renews this node's agent Lease with its own boot id

    def heal(self) -> None:
        fleet.stop(self.rogue, timeout=30)
        text = self.rogue_log.read_text(errors="replace")
        self.facts["rogue_attest_refusals"] = text.count("attest failed")
        self.facts["rogue_forbidden"] = text.count("Forbidden") + text.count("403")
        self.facts["rogue_renewed_lease"] = self.pod in self.facts["lease_holders"]
        if self.facts["rogue_renewed_lease"]:
            self.trial.violation("admission_breaches", None, f"{self.pod} renewed {self.node}'s agent Lease")

    def verify(self) -> None:
        if self.facts.get("accepted"):
            self.failures.append(f"accepted: {self.facts['accepted']}")
        if not self.facts.get("rogue_attest_refusals"):
            self.failures.append("the misconfigured agent never tried to attest (nothing was refused)")
        if "lease renewal failed" not in self.rogue_log.read_text(errors="replace"):
            self.failures.append("the misconfigured agent never tried to renew the other node's Lease")


@fault("worker_attestation")
class WorkerAttestation(Fault):
    """The worker identity tries to write what only the agent (attestation) or a holder of retire
    (retirement) or the operator (Attested/Retirable) may write."""

    def arm(self) -> None:
        plane = self.trial.plane
        ns = self.trial.namespace
        live = next(w for w in self.trial.workers if not w.victim and w.registered and w.kind in ("sleep", "pidns"))
        dead = next(w for w in self.trial.workers if w.victim and w.generic and w.kind in ("sleep", "pidns"))
        client = plane.worker_client

        def attempts_for(w: Worker) -> list[tuple[str, Callable[[], Any]]]:
            body = kube.get_registration(plane.admin, ns, w.name)
            forged = components.attestation(body, verdict="Dead", evidence="PidfdExited")
            retirable = [
                {
                    "type": "Retirable",
                    "status": "True",
                    "reason": "EligibleStaleOrphan",
                    "message": "me",
                    "lastTransitionTime": now_text()[:19] + "Z",
                }
            ]
            return [
                (
                    f"worker attests {w.name}",
                    lambda: kube.patch_status(client, ns, w.name, {"status": {"attestation": forged}}),
                ),
                (
                    f"worker retires {w.name}",
                    lambda: kube.patch_status(
                        client,
                        ns,
                        w.name,
                        {
                            "status": {
                                "retirement": {
                                    "retiredTime": now_text(),
                                    "retiredBy": "worker",
                                    "reason": "PidfdExited",
                                },
                                "state": "Retired",  # as a retirement must (the CRD): refused by admission
                            }
                        },
                    ),
                ),
                (
                    f"worker sets Retirable on {w.name}",
                    lambda: kube.patch_status(
                        client, ns, w.name, [{"op": "add", "path": "/status/conditions", "value": retirable}]
                    ),
                ),
            ]

        self.pending = attempts_for(dead)
        refused, accepted = self.trial.refusals(attempts_for(live))
        self.facts.update(refused=refused, accepted=accepted)

    def strike(self) -> None:
        refused, accepted = self.trial.refusals(self.pending)  # right as the victims die
        self.facts["refused"] += refused
        self.facts["accepted"] += accepted

    def verify(self) -> None:
        if self.facts.get("accepted"):
            self.failures.append(f"accepted: {self.facts['accepted']}")


@fault("malformed")
class Malformed(Fault):
    """Hand-made objects: a garbled heartbeat, an identity the launcher never minted, and ones
    admission must refuse (label disagreeing with spec.nodeName, a non-numeric start time)."""

    def plan(self) -> None:
        node = self.trial.rng.choice(self.trial.nodes)
        self.garbled = self.trial.add(node, "sleep", victim=True, tag="garbled", heartbeating=False)
        self.untrusted = self.trial.add(node, "sleep", victim=True, tag="untrusted", client_instance_id="handmade-1")

    def arm(self) -> None:
        plane, ns = self.trial.plane, self.trial.namespace
        kube.patch_status(
            plane.worker_client, ns, self.garbled.name, {"status": {"lastHeartbeatTime": "yesterday-ish"}}
        )
        self.garbled.heartbeats.append(("yesterday-ish", 0))
        good = self.untrusted.incarnation
        other = next(n for n in plane.agents if n != self.untrusted.node)

        def body(name: str, label: str, inc: dict[str, Any]) -> dict[str, Any]:
            return {
                "apiVersion": api.API_VERSION,
                "kind": api.KIND,
                "metadata": {"name": name, "labels": {api.NODE_LABEL: label}},
                "spec": {
                    "nodeName": self.untrusted.node,
                    "incarnation": inc,
                    "clientInstanceId": f"inst-{name}",
                    "heartbeat": {"intervalSeconds": 2, "ttlSeconds": 6},
                },
            }

        attempts = [
            (
                "label disagrees with spec.nodeName",
                lambda: kube.create_registration(plane.worker_client, ns, body("mislabeled", other, good)),
            ),
            (
                "non-numeric startTime",
                lambda: kube.create_registration(
                    plane.worker_client, ns, body("nonnumeric", self.untrusted.node, {**good, "startTime": "12a"})
                ),
            ),
        ]
        refused, accepted = self.trial.refusals(attempts, statuses=(403, 422))
        self.facts.update(refused=refused, accepted=accepted)

    def blocked(self, w: Worker) -> frozenset[str] | None:
        if w is self.garbled:
            return frozenset({"UnparsableHeartbeat"})
        if w is self.untrusted:
            return frozenset({"UntrustedIdentityProvenance"})
        return None

    def final(self, w: Worker) -> frozenset[str] | None:
        return self.blocked(w)

    def survivor(self, w: Worker) -> frozenset[str] | None:
        return self.blocked(w)

    def verify(self) -> None:
        if self.facts.get("accepted"):
            self.failures.append(f"accepted: {self.facts['accepted']}")
