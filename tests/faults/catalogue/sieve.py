"""Sieve's three patterns (OSDI'22) as real faults on the real control plane.

Each works through the component's own loopback proxy (tests/faults/proxy.py), so the operator and
the agents are the shipped processes, unchanged:

- **stale state** (time travel): the component's watch withholds one registration's events
  (`ApiProxy.hold_events`) while its writes and reads go through, and the world moves on under it —
  the worker dies, its registration is deleted and re-created under the same name for a *new, live*
  incarnation. The component then acts on its old view: the operator retires on the Dead
  attestation of the old incarnation (`stale_view_operator`), the agent attests the old
  incarnation Dead (`stale_view_agent`). The write's preconditions (the resourceVersion and
  attestation `test`s, the agent's heartbeat `test`) must refuse it: the proxy must see it
  answered 404/409/422, and the live incarnation must never be retired nor carry another
  incarnation's attestation.
- **unobserved state**: the events between N and a cancelling N' are never delivered (Alive ->
  Dead -> deleted -> re-created Alive: only the last arrives) to the operator
  (`unobserved_operator`) or to the agent (`unobserved_agent`). The re-created incarnation must be
  judged as itself: never retired while alive, Retired once it dies.
- **intermediate state**: SIGKILL right after each kind of write, between the API server's answer
  and the component reading it (`ApiProxy.tap` with `nth`): the operator after a conditions write,
  a retirement (before its log line and Event) or an Event post (`crash_after_write`); the agent
  after an attestation (`agent_crash_after_write`). A new process takes over; every dead worker
  is Retired once, within the bound.

Each has `mutants` — broken variants that remove, at the wire, the guard the fault exercises
(`mutant-no-cas`: the `test` operations stripped from the write; `mutant-drop-all`: the cancelling
event never delivered either; `mutant-repost`: the crashed operator's successor posts the Event
again) — so that `test_faults.py::test_the_sieve_detectors_fire` proves the oracle that guard
protects is checked.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from typing import Any

from kubernetes import client as k8s

from coroner.client.rest import Rest
from coroner.core.reasons import Reason
from coroner_operator.kubeapi import ADMISSION_RESOURCES
from faults.catalogue.base import AGENT_DOWN, Fault, fault
from faults.proxy import ApiProxy, EventGate, Request, Tap, event_of
from faults.workers import Worker

#: How long a fault waits for the component to act on what it was shown.
ACT_SECONDS = 20.0
#: A write on a stale view refused: its `test`s failed (422), a conflict (409), or the object it
#: was about is gone (404: a component that relisted mid-fault wrote in the delete/re-create gap).
REFUSED = (404, 409, 422)


def strip_tests(body: bytes) -> bytes:
    """A JSON patch without its `test` operations: the write with its preconditions removed."""
    try:
        ops = json.loads(body)
    except ValueError:
        return body
    if not isinstance(ops, list):
        return body
    return json.dumps([op for op in ops if not (isinstance(op, dict) and op.get("op") == "test")]).encode()


@contextlib.contextmanager
def _admission_lifted_unseen(plane: Any) -> Iterator[None]:
    """The plane's admission lift, hidden from the operator: its reads of the admission policies
    are answered with the copies from before the lift. The operator retires nothing while one is
    missing (it fails closed: coroner_operator.permissions), which would keep the mutant's
    retirement from ever reaching the oracle."""
    proxy = plane.operator_proxy
    handles: list[list[int]] = []
    rest = Rest.from_kubeconfig(plane.cluster.kubeconfig)
    try:
        for plural in ADMISSION_RESOURCES.values():
            path = f"/apis/admissionregistration.k8s.io/v1/{plural}"
            before = json.dumps(rest.request("GET", path)).encode()
            handles.append(
                proxy.answer(
                    lambda r, p=path: r.method == "GET" and urllib.parse.urlsplit(r.path).path == p,
                    200,
                    times=sys.maxsize,
                    body=before,
                )
            )
        with plane.admission_lifted():
            yield
    finally:
        for handle in handles:
            proxy.unanswer(handle)
        rest.close()


def _wait(predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return bool(predicate())


def _attested_start(request: Request) -> str | None:
    """The startTime of the incarnation the attestation carried by a status write is about (the
    agent's attestation, or the one a retirement relies on); None if it carries none."""
    body = request.json()
    values: list[Any] = []
    if isinstance(body, list):
        values = [op.get("value") for op in body if isinstance(op, dict) and op.get("op") != "test"]
    elif isinstance(body, dict):
        values = [body.get("status")]
    for value in values:
        if not isinstance(value, dict):
            continue
        for holder in (value, value.get("retirement") if isinstance(value.get("retirement"), dict) else None):
            if holder is None:
                continue
            att = holder.get("attestation") if "attestation" in holder else holder
            inc = att.get("incarnation") if isinstance(att, dict) else None
            if isinstance(inc, dict) and "startTime" in inc:
                return str(inc["startTime"])
    return None


def _writes(namespace: str, name: str | None, *kinds: str) -> Any:
    def match(request: Request) -> bool:
        return request.kind in kinds and request.namespace == namespace and (name is None or request.name == name)

    return match


class _ViewFault(Fault):
    """Common part: one registration (`self.first`) whose events one component's proxy withholds,
    deleted and re-created under the same name for a new incarnation (`self.second`)."""

    component = "operator"
    node_local = True  # the registration's node: its agent must be healthy (and one fault's alone)

    def _proxy(self) -> ApiProxy:
        plane = self.trial.plane
        return plane.operator_proxy if self.component == "operator" else plane.agents[self.node].proxy

    def plan(self) -> None:
        self.variant = self.pick(["reregistered"])
        node = self.node
        self.first = self.trial.add(node, "sleep", victim=True, tag=f"{self.name}-first", generic=False)
        self.second: Worker | None = None
        self.gate: EventGate | None = None
        self.tap: Tap | None = None
        self.rewritten: Any = None
        self.trial.cleanups.append(self._cleanup)

    def _hold(self) -> None:
        ns = self.trial.namespace
        proxy = self._proxy()
        if self.component == "operator" and not _wait(
            lambda: self.trial.reason(self.first) == Reason.PID_ALIVE, ACT_SECONDS
        ):
            # Held before its decision is written, the operator's own conditions write would be
            # refused once the world moved and its re-read (the new registration, a newer
            # resourceVersion) would replace the view the fault withholds: nothing stale to act on.
            self.failures.append("the operator did not decide the first incarnation PidAlive before the hold")
        self.gate = proxy.hold_events(event_of(ns, self.first.name), mode="drop" if self._drops() else "hold")
        self.tap = proxy.tap(_writes(ns, self.first.name, "retirement", "attestation", "conditions"))
        if self.variant == "mutant-no-cas":
            kind = "retirement" if self.component == "operator" else "attestation"
            self.rewritten = proxy.rewrite(_writes(ns, self.first.name, kind), strip_tests)

    def _drops(self) -> bool:
        return False

    def _reregister(self, *, victim: bool) -> None:
        self.second = self.trial.reregister(self.first, victim=victim, tag=f"{self.name}-second")
        self.facts["uids"] = 2

    def _release(self, keep: Any = None) -> None:
        if self.gate is not None and not self.gate.released.is_set():
            counts = self._proxy().release(self.gate, keep)
            self.facts.update({f"events_{k}": v for k, v in counts.items()})
            self.trial.note(f"{self.label}: view released {counts}")

    def _cleanup(self) -> None:
        proxy = self._proxy()
        if self.gate is not None and not self.gate.released.is_set():
            proxy.release(self.gate)
        if self.tap is not None:
            proxy.untap(self.tap)
        if self.rewritten is not None:
            proxy.unrewrite(self.rewritten)
            self.rewritten = None

    def heal(self) -> None:
        self._release()
        self._cleanup()

    def _attested(self, w: Worker, verdict: str) -> bool:
        """The admin's fresh view: `w`'s registration carries a `verdict` attestation of exactly
        its incarnation."""
        body = self.trial.plane.retry(lambda: self.trial.get(w.name)) or {}
        if str(((body.get("spec") or {}).get("incarnation") or {}).get("startTime")) != str(w.start_time):
            return False
        att = (body.get("status") or {}).get("attestation") or {}
        inc = att.get("incarnation") or {}
        return att.get("verdict") == verdict and str(inc.get("startTime")) == str(w.start_time)

    def _count(self, statuses: list[int]) -> None:
        """Numeric facts (the long run sums them per fault): stale writes refused and accepted."""
        self.facts["stale_writes_refused"] = sum(1 for s in statuses if s in REFUSED)
        self.facts["stale_writes_accepted"] = sum(1 for s in statuses if 200 <= s < 300)

    def _refused(self, kind: str) -> list[int]:
        """Answers to the component's writes of `kind` about the first (stale) incarnation."""
        assert self.tap is not None
        first = str(self.first.start_time)
        return [
            status
            for request, status in self.tap.answers
            if request.kind == kind and request.name == self.first.name and _attested_start(request) == first
        ]


@fault("stale_view_operator")
class StaleViewOperator(_ViewFault):
    """The operator decides on the Dead attestation of an incarnation whose registration was since
    deleted and re-created for a live one; its retirement must be refused (404/409/422)."""

    mutants = ("mutant-no-cas",)

    def arm(self) -> None:
        self._hold()

    def strike(self) -> None:
        self.first.kill()
        if not _wait(lambda: self._attested(self.first, "Dead"), ACT_SECONDS):
            self.failures.append("the agent did not attest the first incarnation Dead")

    def after(self) -> None:
        self._reregister(victim=False)
        assert self.second is not None
        if not _wait(lambda: self._attested(self.second, "Alive"), ACT_SECONDS):  # type: ignore[arg-type]
            self.failures.append("the re-created registration was not attested Alive")
        uid = None
        if self.gate is not None:
            for event in self.gate.events():
                meta = (event.get("object") or {}).get("metadata") or {}
                uid = uid or meta.get("uid")

        def up_to_dead(events: list[dict[str, Any]]) -> list[int]:
            # The lagging view: everything up to the first Dead attestation of the old object, and
            # nothing after it (its deletion and the new object are never shown).
            for index, event in enumerate(events):
                obj = event.get("object") or {}
                att = (obj.get("status") or {}).get("attestation") or {}
                if obj.get("metadata", {}).get("uid") == uid and att.get("verdict") == "Dead":
                    return list(range(index + 1))
            return []

        with (
            _admission_lifted_unseen(self.trial.plane) if self.variant == "mutant-no-cas" else contextlib.nullcontext()
        ):
            # The mutant: the retirement's `test`s stripped, and admission (which asks for a Dead
            # attestation of exactly the incarnation retired) lifted: no guard left but the oracle.
            self._release(up_to_dead)
            if not self.facts.get("events_delivered"):
                self.failures.append("no withheld event showed the old incarnation Dead")
                return
            _wait(lambda: bool(self._refused("retirement")), ACT_SECONDS)
        self.facts["retirement_statuses"] = self._refused("retirement")
        self._count(self.facts["retirement_statuses"])
        self.trial.note(f"{self.label}: the operator's retirements on the stale view: {self._refused('retirement')}")

    def verify(self) -> None:
        statuses = self.facts.get("retirement_statuses") or []
        if self.variant.startswith("mutant"):
            if not any(200 <= s < 300 for s in statuses):  # nothing for the detectors to see
                self.failures.append(f"the mutant's retirement never landed: {statuses}")
            return
        if not statuses:
            self.failures.append(f"the operator never tried to retire on the stale view; {self._operator_said()}")
        elif any(200 <= s < 300 for s in statuses):
            self.failures.append(f"a retirement on the stale view was accepted: {statuses}")
        elif not all(s in REFUSED for s in statuses):
            self.failures.append(f"unexpected answers to the stale retirement: {statuses}")

    def _operator_said(self) -> str:
        """What the operator logged about the first registration: a retirement it began and gave up
        (fence moved, abandoned, failed) or a reconcile error says why no write reached the proxy."""
        name = f"{self.trial.namespace}/{self.first.name}"
        logs = self.trial.plane.operator_logs  # every operator this plane started, in order
        lines = [line.strip() for log in logs for line in log.read_text(errors="replace").splitlines() if name in line]
        return f"its log about {name}: {lines[-8:]}" if lines else f"its log names {name} nowhere"


@fault("stale_view_agent")
class StaleViewAgent(_ViewFault):
    """The agent attests Dead an incarnation whose registration was deleted and re-created for a
    live one while its watch withheld that; its attestation must be refused (404/409/422)."""

    component = "agent"
    mutants = ("mutant-no-cas",)

    def arm(self) -> None:
        self._hold()
        self._reregister(victim=False)  # the agent does not see it: its view still has the first

    def strike(self) -> None:
        self.first.kill()
        _wait(lambda: bool(self._refused("attestation")), ACT_SECONDS)
        self.facts["attestation_statuses"] = self._refused("attestation")
        self._count(self.facts["attestation_statuses"])

    def after(self) -> None:
        if self.variant.startswith("mutant"):
            time.sleep(2.0)  # the observer sees what the unguarded write left, before the view heals
        self._release()  # the view catches up

    def verify(self) -> None:
        statuses = self.facts.get("attestation_statuses") or []
        if self.variant.startswith("mutant"):
            if not any(200 <= s < 300 for s in statuses):  # nothing for the detectors to see
                self.failures.append(f"the mutant's attestation never landed: {statuses}")
            return
        if any(200 <= s < 300 for s in statuses):
            self.failures.append(f"an attestation on the stale view was accepted: {statuses}")
        elif not statuses:
            self.failures.append("the agent never attested on the stale view")


@fault("unobserved_operator")
class UnobservedOperator(_ViewFault):
    """The operator never sees Dead, the deletion and the re-creation: only the newest state of
    the re-created registration. It must judge the new incarnation alone and retire it once dead."""

    mutants = ("mutant-drop-all",)

    def _drops(self) -> bool:
        return self.variant == "mutant-drop-all"

    def arm(self) -> None:
        self._hold()

    def strike(self) -> None:
        self.first.kill()
        if not _wait(lambda: self._attested(self.first, "Dead"), ACT_SECONDS):
            self.failures.append("the agent did not attest the first incarnation Dead")
        self._reregister(victim=True)
        assert self.second is not None
        if not _wait(lambda: self._attested(self.second, "Alive"), ACT_SECONDS):  # type: ignore[arg-type]
            self.failures.append("the re-created registration was not attested Alive")
        if self.variant != "mutant-drop-all":
            self._release(lambda events: [len(events) - 1] if events else [])
        time.sleep(self.rng.uniform(0.2, 1.5))
        assert self.second is not None
        self.second.kill()

    def verify(self) -> None:
        if not self.variant.startswith("mutant") and not self.facts.get("events_withheld"):
            self.failures.append("no event was withheld: nothing went unobserved")


@fault("unobserved_agent")
class UnobservedAgent(_ViewFault):
    """The agent never sees the deletion of its node's registration nor the re-creation: only the
    newest state, another incarnation under the same name. The old incarnation's exit (its pidfd)
    must not be charged to the new one; the new one is attested and retired once dead."""

    component = "agent"
    mutants = ("mutant-drop-all",)

    def _drops(self) -> bool:
        return self.variant == "mutant-drop-all"

    def arm(self) -> None:
        self._hold()
        self._reregister(victim=True)
        time.sleep(self.rng.uniform(0.5, 1.5))  # the new object's first heartbeats, withheld too
        if self.variant != "mutant-drop-all":
            self._release(lambda events: [len(events) - 1] if events else [])
            assert self.second is not None
            if not _wait(lambda: self._attested(self.second, "Alive"), ACT_SECONDS):  # type: ignore[arg-type]
                self.failures.append("the agent did not attest the re-created incarnation Alive")

    def strike(self) -> None:
        self.first.kill()  # its pidfd, if the agent still holds it, fires now
        time.sleep(self.rng.uniform(0.5, 2.0))
        assert self.second is not None
        if not self.second.alive():
            self.failures.append("the second incarnation died early")
        self.second.kill()

    def verify(self) -> None:
        if not self.variant.startswith("mutant") and not self.facts.get("events_withheld"):
            self.failures.append("no event was withheld: nothing went unobserved")


# --- intermediate state: SIGKILL right after a write ---------------------------------------------


@fault("crash_after_write")
class CrashAfterWrite(Fault):
    """SIGKILL the operator right after the API server answered its n-th write of one kind in this
    trial's namespace — conditions, a retirement (before its log line and Event), an Event — before
    it reads the answer; a new operator after 0-2 s."""

    cluster_wide = True
    mutants = ("mutant-repost",)

    def plan(self) -> None:
        self.variant = self.pick(["conditions", "retirement", "event"])
        self.kind = "event" if self.variant == "mutant-repost" else self.variant
        self.tap: Tap | None = None
        self.restarted = threading.Event()
        self.trial.cleanups.append(self._cleanup)
        if self.kind == "conditions":
            self._install(nth=self.rng.randint(1, 4))  # fires while the trial's workers are set up

    def _install(self, *, nth: int) -> None:
        plane = self.trial.plane

        def kill(request: Request) -> None:
            for operator in list(plane.operators[:1]):
                os.kill(operator.proc.pid, signal.SIGKILL)

        self.facts["nth"] = nth
        self.tap = plane.operator_proxy.tap(_writes(self.trial.namespace, None, self.kind), nth=nth, action=kill)

    def arm(self) -> None:
        if self.tap is None:
            self._install(nth=self.rng.randint(1, 2) if self.kind == "retirement" else 1)

    def after(self) -> None:
        assert self.tap is not None
        plane = self.trial.plane
        if not self.tap.fired.wait(ACT_SECONDS) and not self.tap.disarm():
            self.failures.append(f"no {self.kind} write to crash after ({self.tap.statuses()})")
            return
        request = self.tap.fired_request
        self.facts["crashed_after"] = f"{self.kind} {request.name if request else ''}"
        self.facts[f"crashes_after_{self.kind}"] = 1
        self.trial.note(f"operator SIGKILLed right after its {self.kind} write {self.facts['crashed_after']}")
        plane.kill_operator()
        time.sleep(self.rng.uniform(0.0, 2.0))
        plane.start_operator()
        if self.variant == "mutant-repost" and request is not None:
            self._repost(request)

    def _repost(self, request: Request) -> None:
        """The broken successor: posts the crashed operator's Event again (a new name)."""
        body = request.json() or {}
        meta = body.setdefault("metadata", {})
        meta["name"] = f"{meta.get('name', 'repost')}.{uuid.uuid4().hex[:6]}"
        meta.pop("resourceVersion", None)
        plane = self.trial.plane
        k8s.CoreV1Api(plane.operator_client()).create_namespaced_event(self.trial.namespace, body)
        self.trial.note(f"mutant: the Event re-posted as {meta['name']}")

    def _cleanup(self) -> None:
        if self.tap is not None:
            self.trial.plane.operator_proxy.untap(self.tap)

    def heal(self) -> None:
        self._cleanup()

    def verify(self) -> None:
        events = self.trial.plane.retry(
            lambda: k8s.CoreV1Api(self.trial.plane.admin).list_namespaced_event(self.trial.namespace).items
        )
        with_event = {e.involved_object.name for e in events if e.reason == "Retired"}
        retired = [w for w in self.trial.tracked() if w.retired_seen is not None]
        self.facts["retired_without_event"] = sum(1 for w in retired if w.name not in with_event)


@fault("agent_crash_after_write")
class AgentCrashAfterWrite(Fault):
    """SIGKILL a node's agent right after the API server answered its first attestation write of
    this trial's deaths, before it reads the answer; started again after 0-2 s."""

    node_local = True

    def plan(self) -> None:
        self.variant = self.pick(["attestation"])
        self.tap: Tap | None = None
        self.trial.cleanups.append(self._cleanup)

    def arm(self) -> None:
        agent = self.trial.plane.agents[self.node]  # type: ignore[index]

        def kill(request: Request) -> None:
            if agent.proc is not None:
                os.kill(agent.proc.pid, signal.SIGKILL)

        self.tap = agent.proxy.tap(_writes(self.trial.namespace, None, "attestation"), nth=1, action=kill)

    def after(self) -> None:
        assert self.tap is not None
        agent = self.trial.plane.agents[self.node]  # type: ignore[index]
        if not self.tap.fired.wait(ACT_SECONDS) and not self.tap.disarm():
            self.failures.append(f"no attestation write to crash after ({self.tap.statuses()})")
            return
        request = self.tap.fired_request
        self.facts["crashed_after"] = f"attestation {request.name if request else ''}"
        self.facts["crashes_after_attestation"] = 1
        self.trial.note(f"agent of {self.node} SIGKILLed right after its attestation write")
        agent.kill()
        time.sleep(self.rng.uniform(0.0, 2.0))
        agent.start()

    def blocked(self, w: Worker) -> frozenset[str] | None:
        return None

    def _cleanup(self) -> None:
        if self.tap is not None and self.node is not None:
            self.trial.plane.agents[self.node].proxy.untap(self.tap)

    def heal(self) -> None:
        self._cleanup()


__all__ = ["AGENT_DOWN", "strip_tests"]
