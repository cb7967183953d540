"""The invariants: the oracles a trial checks, independent of how the faults are injected.

- safety, on every version of every registration the observer is shown (`observer`: a list, then
  watches; `observe_object`, `check_retirement`): no attestation of another incarnation; and on a
  retirement, the incarnation was dead (the harness's own pidfd, and the retirement time is after
  the harness's kill), the retirement never changes, it carries a Dead attestation for exactly its
  incarnation by its own node's agent (`provenance_problems`), and it did not happen while the
  grant was revoked;
- liveness (`observe_phase`, `settle`): every dead worker no fault holds is Retired within BOUND,
  every held one carries a reason its fault explains, and every dead one is Retired within BOUND of
  the heal unless something still true explains it;
- history (`verify_history`): one Retired Event and one `retired` log line per object, and no
  heartbeat committed before the decided resourceVersion that the relied-on attestation did not see.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

from kubernetes import client as k8s
from kubernetes import watch

from coroner.core import api
from faults.plane import AGENT_SA, OPERATOR_SA
from faults.workers import Worker, parse_time, read_stat
from support import kube

if TYPE_CHECKING:
    from faults.trial import Trial

#: Liveness bound: a dead worker whose node's agent is healthy is Retired within this many seconds
#: of its death, or of the end of the fault that kept it (generous: a shared 2-core machine).
BOUND = 30.0
#: The same for 500 deaths in one second (each needs an attestation, a retirement and an Event).
MASS_BOUND = 90.0

DEATH_EVIDENCE = frozenset({"PidfdExited", "ProcAbsent", "PidNamespaceRecreated", "BootBoundary"})
NODE_EVIDENCE = frozenset({"NodeDeleted", "NodeOutOfService"})
#: How long one of the observer's watches lasts before it is resumed (and its stop noticed).
WATCH_SECONDS = 5
#: The observer's pause before it lists again after a failed list or watch.
RELIST_PAUSE_SECONDS = 0.3
RETIRED_LINE = re.compile(r"retired workerregistration=([^/\s]+)/(\S+) .*?resourceVersion=(\d+)")
SAFETY = ("live_retired", "double_retired", "bad_provenance", "admission_breaches", "retired_without_grant")
COUNTERS = (*SAFETY, "dead_left_active", "wrong_reason", "not_injected")


# --- safety: on every version of every registration the observer is shown ------------------------


def observe_once(trial: Trial) -> str:
    """Lists the trial's namespace and checks every object; returns the list's resourceVersion."""
    listed = kube.custom(trial.plane.admin).list_namespaced_custom_object(
        api.GROUP, api.VERSION, trial.namespace, api.PLURAL, _request_timeout=20
    )
    now = time.time()
    with trial._lock:
        for obj in listed["items"]:
            observe_object(trial, obj, now)
    return str(listed["metadata"]["resourceVersion"])


def watch_once(trial: Trial, resource_version: str) -> str:
    """Watches the trial's namespace from `resource_version` for up to WATCH_SECONDS and checks
    every version of every object it is shown; returns the last resourceVersion seen. A watch the
    API server ends with an error (410 Gone) raises (the client's ApiException): list again."""
    stream = watch.Watch()
    for event in stream.stream(
        kube.custom(trial.plane.admin).list_namespaced_custom_object,
        api.GROUP,
        api.VERSION,
        trial.namespace,
        api.PLURAL,
        resource_version=resource_version,
        allow_watch_bookmarks=True,
        timeout_seconds=WATCH_SECONDS,
        _request_timeout=WATCH_SECONDS + 10,
    ):
        obj = event["object"]
        resource_version = str(obj["metadata"]["resourceVersion"])
        if event["type"] in ("ADDED", "MODIFIED"):
            with trial._lock:
                observe_object(trial, obj, time.time())
        if trial._stop.is_set():
            stream.stop()
    return resource_version


def observe_object(trial: Trial, obj: dict[str, Any], now: float) -> None:
    """The safety checks on one version of one registration (with trial._lock held)."""
    name = obj["metadata"]["name"]
    trial._latest[name] = obj
    w = trial.by_name.get(name)
    status = obj.get("status") or {}
    reason = next((c.get("reason") for c in status.get("conditions") or [] if c.get("type") == "Retirable"), None)
    if w is not None and reason and (not w.reasons_seen or w.reasons_seen[-1] != reason):
        w.reasons_seen.append(reason)
    attestation = status.get("attestation") or {}
    if (attestation.get("agent") or {}).get("podName") in trial.rogue_pods:
        trial.violation("admission_breaches", w, f"{name} carries an attestation by a rogue agent")
        trial.rogue_pods.discard((attestation.get("agent") or {}).get("podName"))
    stale = stale_attestation(obj)
    if stale and (obj["metadata"]["uid"], stale) not in trial._stale_seen:
        trial._stale_seen.add((obj["metadata"]["uid"], stale))
        trial.violation("bad_provenance", w, f"{name} carries an attestation of another incarnation: {stale}")
    retirement = status.get("retirement")
    if retirement is None:
        return
    if w is None:
        trial.violation("bad_provenance", None, f"{name}: retired, but the harness never registered it")
        return
    if w.retired_seen is None:
        w.retired_seen, w.retired_seen_at = retirement, now
        check_retirement(trial, w, obj, retirement)
    elif retirement != w.retired_seen:
        trial.violation("double_retired", w, f"{name}: status.retirement changed after it was set")
        w.retired_seen = retirement


def check_retirement(trial: Trial, w: Worker, obj: dict[str, Any], retirement: dict[str, Any]) -> None:
    name = w.name
    retired_time = parse_time(retirement.get("retiredTime"))
    if w.alive():
        trial.violation("live_retired", w, f"{name} retired while its incarnation is alive (harness pidfd)")
    elif w.killed_at is None or retired_time is None or retired_time < w.killed_at:
        trial.violation(
            "live_retired", w, f"{name} retired at {retirement.get('retiredTime')}, before the harness killed it"
        )
    if trial.grant_revoked is not None and retired_time is not None:
        start, end = trial.grant_revoked
        if retired_time > start and (end is None or retired_time < end):
            trial.violation("retired_without_grant", w, f"{name} retired while the retire grant was revoked")
    problems = provenance_problems(obj, retirement)
    if problems:
        trial.violation("bad_provenance", w, f"{name}: {'; '.join(problems)}")
    trial.result.evidence.setdefault("retired_by", Counter())[str(retirement.get("reason"))] += 1


def observer(trial: Trial) -> None:
    """The observer thread's loop until stopped: a list, then watches resumed from the last
    resourceVersion, so that every version of every registration passes the checks — a state that
    lived only until the next write (an attestation written on a stale view and overwritten by the
    next probe) included, which a poll could miss. A failed watch (an API server restart, 410 Gone)
    lists again."""
    resource_version: str | None = None
    while not trial._stop.is_set():
        try:
            if resource_version is None:
                resource_version = observe_once(trial)
            resource_version = watch_once(trial, resource_version)
        except Exception:
            resource_version = None
            trial._stop.wait(RELIST_PAUSE_SECONDS)


INCARNATION_FIELDS = ("bootId", "pidNamespace", "pid", "startTime", "hostId")


def stale_attestation(obj: dict[str, Any]) -> str:
    """Why the object's attestation is not about its own incarnation ('' when it is, or when there
    is none). The spec's incarnation never changes, and every agent writes for the incarnation it
    read: only a write made on a stale view, past its preconditions, leaves another one here."""
    att = (obj.get("status") or {}).get("attestation") or {}
    attested = att.get("incarnation") or {}
    if not attested:
        return ""
    inc = (obj.get("spec") or {}).get("incarnation") or {}
    wrong = [
        f"{f} {attested.get(f)!r} != {inc.get(f)!r}"
        for f in INCARNATION_FIELDS
        if str(attested.get(f)) != str(inc.get(f))
    ]
    return f"{att.get('verdict')} for {', '.join(wrong)}" if wrong else ""


def provenance_problems(obj: dict[str, Any], retirement: dict[str, Any]) -> list[str]:
    """Why a retirement is not backed by a Dead attestation for exactly its incarnation, by its
    own node's agent (empty: it is)."""
    problems = []
    spec = obj.get("spec") or {}
    inc = spec.get("incarnation") or {}
    reason = retirement.get("reason")
    if retirement.get("retiredBy") != OPERATOR_SA:
        problems.append(f"retiredBy {retirement.get('retiredBy')!r}")
    if reason in NODE_EVIDENCE:
        problems.append(f"node-level evidence {reason} while that policy is off")
        return problems
    att = retirement.get("attestation") or {}
    if att.get("verdict") != "Dead":
        problems.append(f"attestation verdict {att.get('verdict')!r}")
    if att.get("evidence") not in DEATH_EVIDENCE or att.get("evidence") != reason:
        problems.append(f"evidence {att.get('evidence')!r} / reason {reason!r}")
    for field in INCARNATION_FIELDS:
        if str((att.get("incarnation") or {}).get(field)) != str(inc.get(field)):
            problems.append(f"attested {field} {(att.get('incarnation') or {}).get(field)!r} != {inc.get(field)!r}")
    agent = att.get("agent") or {}
    if agent.get("nodeName") != spec.get("nodeName"):
        problems.append(f"attested by the agent of {agent.get('nodeName')!r}, not {spec.get('nodeName')!r}")
    if agent.get("identity") != AGENT_SA:
        problems.append(f"attested by identity {agent.get('identity')!r}")
    if not str(agent.get("podName", "")).startswith(f"agent-{spec.get('nodeName')}-"):
        problems.append(f"attested by pod {agent.get('podName')!r}")
    same_boot = att.get("bootId") == inc.get("bootId")
    if (att.get("evidence") == "BootBoundary") == same_boot:
        problems.append(f"{att.get('evidence')} with agent boot {att.get('bootId')} vs incarnation {inc.get('bootId')}")
    return problems


# --- liveness and reasons ------------------------------------------------------------------------


def held_by_faults(trial: Trial, w: Worker) -> frozenset[str] | None:
    sets = [s for f in trial.faults if (s := f.blocked(w)) is not None]
    return frozenset().union(*sets) if sets else None


def final_by_faults(trial: Trial, w: Worker) -> frozenset[str] | None:
    sets = [s for f in trial.faults if (s := f.final(w)) is not None]
    return frozenset().union(*sets) if sets else None


def is_retired(trial: Trial, w: Worker) -> bool:
    return w.retired_seen is not None


def naturally_reused(trial: Trial, w: Worker) -> bool:
    """Preserved as PidReuseDetected because some unrelated process took the dead worker's
    root-namespace pid before the agent looked (the design: preserve until that one exits)."""
    if w.kind not in ("sleep", "zombie_leader") or trial.reason(w) != "PidReuseDetected":
        return False
    stat = read_stat(w.host_pid)
    return stat is not None and stat[1] != w.start_time


def observe_phase(trial: Trial) -> None:
    dead = [w for w in trial.tracked() if w.dead]
    blocked = {w: b for w in dead if (b := held_by_faults(trial, w)) is not None}
    disturbed = {w for w in dead if w not in blocked and any(f.disturbs(w) for f in trial.faults)}
    free = [w for w in dead if w not in blocked and w not in disturbed]
    phase_start = time.monotonic()
    hold = max([f.hold for f in trial.faults] + [0.0])
    bound = trial.mass_bound if any(f.name == "mass_death" for f in trial.faults) else trial.bound

    def settled() -> bool:
        return all(is_retired(trial, w) for w in free) and all(
            trial.reason(w) in reasons or is_retired(trial, w) for w, reasons in blocked.items()
        )

    trial.wait(lambda: settled() and time.monotonic() - phase_start >= hold, bound + hold)
    with contextlib.suppress(Exception):
        trial.refresh()
    for w in free:
        if is_retired(trial, w):
            assert w.retired_seen_at is not None and w.killed_at is not None
            trial.result.latencies.append(w.retired_seen_at - w.killed_at)
        elif naturally_reused(trial, w):
            trial.result.evidence.setdefault("notes", Counter())["natural_pid_reuse_preserved"] += 1
        else:
            trial.violation(
                "dead_left_active",
                w,
                f"{w.name} dead, not blocked by any fault, still {trial.reason(w)} "
                f"{bound:.0f} s after the faults' post-death steps",
            )
    for w, reasons in blocked.items():
        reason = trial.reason(w)
        for f in trial.faults:
            if f.blocked(w) is not None:
                trial.result.reasons.setdefault(f.label.split("[")[0], Counter())[str(reason)] += 1
        if is_retired(trial, w):
            trial.violation("wrong_reason", w, f"{w.name} retired although {sorted(reasons)} should hold it")
        elif reason not in reasons:
            trial.violation("wrong_reason", w, f"{w.name} preserved as {reason}, expected one of {sorted(reasons)}")
    trial.note("observe phase done")


def settle(trial: Trial) -> None:
    healed = time.monotonic()
    bound = trial.mass_bound if any(f.name == "mass_death" for f in trial.faults) else trial.bound
    dead = [w for w in trial.tracked() if w.dead]
    finals = {w: f for w in dead if (f := final_by_faults(trial, w)) is not None}

    def done() -> bool:
        return all(is_retired(trial, w) or (w in finals and trial.reason(w) in finals[w]) for w in dead)

    trial.wait(done, bound)
    with contextlib.suppress(Exception):
        trial.refresh()
    for w in dead:
        if is_retired(trial, w):
            continue
        reason = trial.reason(w)
        if w in finals:
            trial.result.reasons.setdefault("final", Counter())[str(reason)] += 1
            if reason not in finals[w]:
                trial.violation(
                    "wrong_reason",
                    w,
                    f"{w.name} preserved as {reason} after the heal, expected {sorted(finals[w])}",
                )
        elif naturally_reused(trial, w):
            trial.result.reasons.setdefault("final", Counter())["PidReuseDetected(natural)"] += 1
        else:
            trial.violation(
                "dead_left_active",
                w,
                f"{w.name} ({w.kind} on {w.node}) dead and still {reason} {bound:.0f} s after the heal",
            )
    # Survivors: alive, never retired (the observer checks), with the reason their faults explain.
    for w in trial.tracked():
        if w.dead:
            continue
        if not w.alive():
            trial.violation("not_injected", w, f"{w.name} died without the harness killing it")
            continue
        sets = [s for f in trial.faults if (s := f.survivor(w)) is not None]
        expected = frozenset().union(*sets) if sets else frozenset({"PidAlive"})
        if not trial.wait(lambda w=w, e=expected: trial.reason(w) in e, 10.0):
            trial.violation("wrong_reason", w, f"live {w.name} is {trial.reason(w)}, expected {sorted(expected)}")
        trial.result.reasons.setdefault("live", Counter())[str(trial.reason(w))] += 1
    trial.note(f"settled in {time.monotonic() - healed:.1f} s")


def verify_history(trial: Trial) -> None:
    """Each retirement once: Events per object, operator log lines per object, and no heartbeat
    committed before the decided resourceVersion that the relied-on attestation did not see."""
    events = trial.plane.retry(lambda: k8s.CoreV1Api(trial.plane.admin).list_namespaced_event(trial.namespace).items)
    per_object = Counter(e.involved_object.uid for e in events if e.reason == "Retired")
    for uid, count in per_object.items():
        if count > 1:
            trial.violation("double_retired", None, f"{count} Retired Events for object uid {uid}")
    decided: dict[str, list[int]] = {}
    for log in trial.plane.operator_logs:
        with contextlib.suppress(OSError):
            for ns, name, rv in RETIRED_LINE.findall(log.read_text(errors="replace")):
                if ns == trial.namespace:
                    decided.setdefault(name, []).append(int(rv))
    for name, rvs in decided.items():
        if len(rvs) > 1:
            trial.violation("double_retired", trial.by_name.get(name), f"{name} logged as retired {len(rvs)} times")
        w = trial.by_name.get(name)
        if w is None or w.retired_seen is None or not w.heartbeats:
            continue
        seen = ((w.retired_seen.get("attestation") or {}).get("heartbeatSeen")) or ""
        before = [value for value, rv in sorted(w.heartbeats, key=lambda h: h[1]) if 0 < rv <= rvs[0]]
        if before and before[-1] != seen and seen in w.heartbeats_unanswered and seen > before[-1]:
            # A heartbeat whose answer the harness never got (the API server was killed after the
            # commit): the attestation saw it, so it was committed, and it is the newer one.
            trial.result.evidence.setdefault("notes", Counter())["heartbeat_answer_lost_but_committed"] += 1
        elif before and before[-1] != seen:
            trial.violation(
                "bad_provenance",
                w,
                f"{name} retired at resourceVersion {rvs[0]} on an attestation that saw "
                f"heartbeat {seen!r}, but heartbeat {before[-1]!r} was committed before that",
            )
        if w.killed_at is not None and any(rv > rvs[0] for _, rv in w.heartbeats):
            trial.result.evidence.setdefault("notes", Counter())["heartbeat_after_retirement"] += 1
