"""Doctor's operator-memory check: each operator Pod's resident memory against its container's limit.

The operator holds every registration of the cluster in memory (docs/operations.md, "Memory": about
73 MiB + 5.9 MiB per 1,000), and so does its standby. A cluster that outgrows the limit has its
operator OOM-killed, and every restart lists the whole cluster again before it decides anything.
Nothing is retired wrongly meanwhile, but nothing is retired either: doctor warns first.

Measured without metrics-server, which many clusters lack: the Pods from the API (their limit, their
restarts and OOM kills), and each Running Pod's own /metrics (`process_resident_memory_bytes`, from
prometheus_client's process collector) read through the API server's Pod proxy, which needs `get
pods/proxy` in the system namespace and a NetworkPolicy that admits the API server. Where either
is missing, the memory is UNKNOWN, never a pass. The resident set is what the benchmarks measured;
the kernel charges the container's cgroup a little more (page cache), hence the warning at
`WARN_FRACTION` of the limit rather than at the limit.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from coroner.cli.doctor.outcome import Check, object_name, passed, unknown, warned
from coroner.cli.plan import Unreadable

#: From this share of its memory limit an operator Pod's resident memory is a WARN.
WARN_FRACTION: Final = 0.8
#: The operator's Pods: the selector label of its Deployment (not prefixed by a Helm namePrefix).
OPERATOR_POD_SELECTOR: Final = "app.kubernetes.io/name=coroner-operator"
#: The operator's container in its Pod, and the container port its /metrics is served on.
CONTAINER: Final = "operator"
METRICS_PORT_NAME: Final = "metrics"
RSS_METRIC: Final = "process_resident_memory_bytes"
#: What to change, said in every WARN.
FIX: Final = (
    "raise its memory limit (chart: operator.resources.limits.memory; kustomize: the coroner-operator "
    'Deployment\'s) by the table of docs/operations.md, "Memory"'
)

_MiB: Final = 1 << 20
_SUFFIXES: Final = {
    "Ki": 1 << 10,
    "Mi": 1 << 20,
    "Gi": 1 << 30,
    "Ti": 1 << 40,
    "Pi": 1 << 50,
    "Ei": 1 << 60,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "": 1,
}
_QUANTITY: Final = re.compile(r"^([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE]([-+]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?)$")


def memory_bytes(quantity: object) -> int | None:
    """A Kubernetes quantity (``512Mi``, ``1G``, ``1e9``, a number) in bytes; None when it is none."""
    if isinstance(quantity, int | float) and not isinstance(quantity, bool):
        return int(quantity)
    match = _QUANTITY.match(str(quantity).strip()) if isinstance(quantity, str) else None
    if match is None:
        return None
    number, exponent, suffix = match.groups()
    scale = 10 ** int(exponent) if exponent is not None else _SUFFIXES[suffix or ""]
    return int(float(number) * scale)


def resident_bytes(metrics: str) -> float | None:
    """`process_resident_memory_bytes` of a Prometheus text exposition; None when it has none."""
    for line in metrics.splitlines():
        name, _, value = line.partition(" ")
        if name == RSS_METRIC:
            try:
                return float(value.split()[0])
            except (ValueError, IndexError):
                return None
    return None


def _container(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    return next((c for c in containers if c.get("name") == CONTAINER), containers[0])


def metrics_port(pod: Mapping[str, Any]) -> int | None:
    """The port of a Running operator Pod's /metrics, when it serves one (the container port named
    `METRICS_PORT_NAME`); None: nothing to read."""
    if (pod.get("status") or {}).get("phase") != "Running":
        return None
    for port in _container(pod).get("ports") or []:
        if port.get("name") == METRICS_PORT_NAME and isinstance(port.get("containerPort"), int):
            return int(port["containerPort"])
    return None


def _oom_killed(pod: Mapping[str, Any]) -> str | None:
    """When the operator container last ended OOMKilled (its finishedAt, or "at an unrecorded time")."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") != CONTAINER:
            continue
        for state in (status.get("state") or {}, status.get("lastState") or {}):
            terminated = state.get("terminated") or {}
            if terminated.get("reason") == "OOMKilled":
                return str(terminated.get("finishedAt") or "at an unrecorded time")
    return None


def _mib(value: float) -> str:
    return f"{value / _MiB:.0f} MiB"


def check_operator_memory(
    *,
    pods: Sequence[Mapping[str, Any]] | Unreadable,
    metrics: Mapping[str, str | Unreadable],
    system_namespace: str,
) -> Check:
    """WARN when an operator Pod's resident memory reaches `WARN_FRACTION` of its limit, or it was
    OOM-killed; UNKNOWN where a Pod's memory could not be measured; PASS when every Pod was, under it.
    `metrics`: each Running Pod's /metrics text by Pod name, as read (`metrics_port` says which)."""
    name = "operator-memory"
    if isinstance(pods, Unreadable):
        return unknown(name, f"the operator's Pods in namespace {system_namespace} could not be listed: {pods.reason}")
    if not pods:
        return unknown(
            name,
            f"no Pod labelled {OPERATOR_POD_SELECTOR} in namespace {system_namespace}: nothing to measure "
            f"(an operator run outside the cluster is not measured).",
        )
    said, warnings, unmeasured, facts = [], [], [], {}
    for pod in sorted(pods, key=object_name):
        pod_name = f"{system_namespace}/{object_name(pod)}"
        limit = memory_bytes(((_container(pod).get("resources") or {}).get("limits") or {}).get("memory"))
        read = metrics.get(object_name(pod))
        rss = resident_bytes(read) if isinstance(read, str) else None
        facts[pod_name] = {"residentBytes": rss, "limitBytes": limit}
        oom = _oom_killed(pod)
        if oom is not None:
            warnings.append(pod_name)
            said.append(f"Pod {pod_name} was OOMKilled (finished {oom}): its limit is too small for this cluster")
        if rss is None:
            why = (
                read.reason
                if isinstance(read, Unreadable)
                else f"its /metrics has no {RSS_METRIC}"
                if isinstance(read, str)
                else f"it is not Running with a container port named {METRICS_PORT_NAME}"
            )
            unmeasured.append(pod_name)
            said.append(f"Pod {pod_name} not measured: {why}")
        elif limit is None:
            said.append(f"Pod {pod_name} uses {_mib(rss)}, with no memory limit")
        elif rss >= WARN_FRACTION * limit:
            warnings.append(pod_name)
            said.append(
                f"Pod {pod_name} uses {_mib(rss)} of its {_mib(limit)} limit ({rss / limit:.0%}, "
                f"doctor warns from {WARN_FRACTION:.0%})"
            )
        else:
            said.append(f"Pod {pod_name} uses {_mib(rss)} of its {_mib(limit)} limit ({rss / limit:.0%})")
    text = "; ".join(said)
    if warnings:
        return warned(
            name,
            f"{text}. The operator holds every registration in memory: {FIX}.",
            objects=tuple(f"pod/{pod}" for pod in dict.fromkeys(warnings)),
            names=tuple(f"pod/{pod.partition('/')[2]}" for pod in dict.fromkeys(warnings)),
            facts=facts,
        )
    if unmeasured:
        return unknown(
            name,
            f"{text}. Doctor reads each operator Pod's /metrics through the API server's Pod proxy: that "
            f"needs get pods/proxy in namespace {system_namespace}, and a NetworkPolicy that admits the "
            f"API server to the Pod's metrics port.",
            facts=facts,
        )
    return passed(name, f"{text}; doctor warns from {WARN_FRACTION:.0%} of the limit.", facts=facts)
