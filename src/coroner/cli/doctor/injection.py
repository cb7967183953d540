"""Doctor's `registrar-injection` check: Pods labelled for the registrar that run without it, the
injection policy their label needs, and their running containers that have no registration.

A Pod labelled `coroner.dev/inject: "true"` is injected at its creation by the MutatingAdmissionPolicy
of manifests/components/registrar-injection. Where that policy is missing, has no binding, or was not
yet enforced when the Pod was created, the API server admits the Pod as it is: it runs with no
registrar, and its containers are registered by nothing. Nothing refuses it (so that a missing
policy never stops a workload), so doctor is where it is said, by name, with the fix. A container
of an injected Pod that runs with no registration past a grace is its registrar failing (it logs
why and tries again): a WARN naming the registrar's log.

Only labelled Pods are read (one LIST with a label selector): Pods injected offline by `kubectl
coroner inject` carry no label unless their manifest gives them one.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any, Final

from coroner.cli.doctor.outcome import Check, failed, kubectl_name, object_name, passed, unknown, warned
from coroner.cli.plan import Unreadable
from coroner.core import inject, model
from coroner.core.world import World

#: The label selector of the Pods this check reads.
INJECT_SELECTOR: Final = f"{inject.INJECT_LABEL}=true"
#: The injection policy's name in the component (an overlay's namePrefix may precede it).
POLICY: Final = "coroner-registrar-injection"
COMPONENT: Final = "manifests/components/registrar-injection"
HELM_VALUE: Final = "registrarInjection.enabled=true"
#: A running container of an injected Pod unregistered for longer than this is named: the registrar
#: registers within about a second, and tries a failed registration again within a minute.
REGISTRATION_GRACE_SECONDS: Final = 90.0

_ENDED_PHASES: Final = frozenset({"Succeeded", "Failed"})


def _has_registrar(pod: Mapping[str, Any]) -> bool:
    spec = pod.get("spec") or {}
    return any((c or {}).get("name") == inject.CONTAINER_NAME for c in spec.get("initContainers") or [])


def _where(pod: Mapping[str, Any]) -> str:
    return f"{(pod.get('metadata') or {}).get('namespace') or ''}/{object_name(pod)}"


def _policy_state(
    policies: Sequence[Mapping[str, Any]] | Unreadable, bindings: Sequence[Mapping[str, Any]] | Unreadable
) -> tuple[str | None, str]:
    """The injection policy's name (None: absent or unreadable) and what is wrong with it ("" if nothing)."""
    if isinstance(policies, Unreadable):
        return None, f"the MutatingAdmissionPolicies could not be read ({policies.reason})"
    found = sorted(object_name(p) for p in policies if object_name(p).endswith(POLICY))
    if not found:
        return None, f"the MutatingAdmissionPolicy {POLICY} is not installed"
    if isinstance(bindings, Unreadable):
        return found[0], f"the MutatingAdmissionPolicyBindings could not be read ({bindings.reason})"
    bound = {str((b.get("spec") or {}).get("policyName") or "") for b in bindings}
    unbound = [policy for policy in found if policy not in bound]
    if len(unbound) == len(found):
        return found[0], f"the MutatingAdmissionPolicy {found[0]} has no binding, so the API server never applies it"
    return next(p for p in found if p in bound), ""


def _unregistered_containers(
    pods: Sequence[Mapping[str, Any]], world: World, *, now: datetime.datetime, grace_seconds: float
) -> list[tuple[str, str, str]]:
    """(namespace/pod, container, since) of each container of an injected Pod running past the grace with no
    registration of its current start (`inject.registration_prefix`: the registrar's names)."""
    registered = {(namespace, name.rsplit("-", 1)[0] + "-") for namespace, name in world.parsed}
    found = []
    for pod in pods:
        namespace = str((pod.get("metadata") or {}).get("namespace") or "")
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            running = (status.get("state") or {}).get("running") or {}
            started = model.parse_time(running.get("startedAt")) if running else None
            container_id = str(status.get("containerID") or "").rpartition("://")[2]
            if started is None or not container_id or (now - started).total_seconds() < grace_seconds:
                continue
            prefix = inject.registration_prefix(pod_name=object_name(pod), container=container_id)
            if (namespace, prefix) not in registered:
                found.append((_where(pod), str(status.get("name") or "?"), str(running.get("startedAt"))))
    return found


def check_registrar_injection(
    *,
    pods: Sequence[Mapping[str, Any]] | Unreadable,
    policies: Sequence[Mapping[str, Any]] | Unreadable,
    bindings: Sequence[Mapping[str, Any]] | Unreadable,
    world: World | Unreadable,
    now: datetime.datetime,
    grace_seconds: float = REGISTRATION_GRACE_SECONDS,
) -> Check:
    """FAIL naming each Pod labelled `coroner.dev/inject=true` that runs without the registrar; WARN when
    such Pods all have it while the injection policy is missing or unbound (the next one may not); WARN
    naming each running container of an injected labelled Pod that has no registration past the
    grace; UNKNOWN where the Pods, the policy or the registrations could not be read."""
    name = "registrar-injection"
    if isinstance(pods, Unreadable):
        return unknown(name, f"the Pods labelled {INJECT_SELECTOR} could not be read: {pods.reason}")
    labelled = [pod for pod in pods if (pod.get("status") or {}).get("phase") not in _ENDED_PHASES]
    if not labelled:
        return passed(name, f"no running Pod is labelled {INJECT_SELECTOR}.", facts={"labelledPods": 0})
    policy, policy_problem = _policy_state(policies, bindings)
    without = sorted(_where(pod) for pod in labelled if not _has_registrar(pod))
    install = f"install {COMPONENT} (Helm: {HELM_VALUE}) and wait until a labelled dry-run Pod is injected"
    facts: dict[str, Any] = {"labelledPods": len(labelled), "withoutRegistrar": without, "policy": policy}
    if without:
        why = policy_problem or (
            f"the MutatingAdmissionPolicy {policy} was not yet installed or enforced when they were created"
        )
        return failed(
            name,
            f"{len(without)} of {len(labelled)} Pod(s) labelled {INJECT_SELECTOR} run without the registrar, so "
            f"their containers are registered by nothing: {', '.join(without)}. Why: {why}. Fix: "
            f"{install + ', then ' if policy_problem else ''}recreate them (kubectl delete pod, or kubectl rollout restart their Deployment or StatefulSet).",
            objects=[f"Pod/{where}" for where in without],
            names=[kubectl_name("Pod", where.rsplit("/", 1)[1]) for where in without],
            facts=facts,
        )
    if policy_problem and not isinstance(policies, Unreadable) and not isinstance(bindings, Unreadable):
        # May be right: their manifests may have been injected offline (`kubectl coroner inject`), and a
        # Pod injected so is the same as one the policy injected.
        return warned(
            name,
            f"{len(labelled)} Pod(s) labelled {INJECT_SELECTOR} run with the registrar, but {policy_problem}: the "
            f"next such Pod (a restart, a new replica) runs unregistered unless its manifest was injected with "
            f"kubectl coroner inject. Fix: {install}.",
            objects=[f"MutatingAdmissionPolicy/{policy or POLICY}"],
            names=[kubectl_name("MutatingAdmissionPolicy", policy or POLICY)],
            facts=facts,
        )
    if isinstance(world, Unreadable):
        return unknown(name, f"the registrations of the labelled Pods could not be read: {world.reason}", facts=facts)
    unregistered = _unregistered_containers(labelled, world, now=now, grace_seconds=grace_seconds)
    facts["unregisteredContainers"] = [f"{where} {container}" for where, container, _ in unregistered]
    if unregistered:
        described = "; ".join(
            f"container {container} of Pod {where}, running since {since} (kubectl logs -n "
            f"{where.split('/')[0]} {where.split('/')[1]} -c {inject.CONTAINER_NAME})"
            for where, container, since in unregistered
        )
        return warned(
            name,
            f"{len(unregistered)} running container(s) of injected Pods have no registration after "
            f"{grace_seconds:g}s, so the registrar failed to register them (its log says why; it tries again): "
            f"{described}.",
            objects=sorted({f"Pod/{where}" for where, _, _ in unregistered}),
            names=sorted({kubectl_name("Pod", where.rsplit("/", 1)[1]) for where, _, _ in unregistered}),
            facts=facts,
        )
    if policy_problem:
        return unknown(
            name, f"{len(labelled)} labelled Pod(s) run with the registrar, but {policy_problem}.", facts=facts
        )
    return passed(
        name,
        f"{len(labelled)} Pod(s) labelled {INJECT_SELECTOR} run with the registrar and every running container "
        f"is registered; {policy} is installed and bound.",
        facts=facts,
    )
