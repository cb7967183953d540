"""Doctor's `agent-seccomp` check: the seccomp profile the agents are confined by is the one shipped.

The agent's init container copies `agent-seccomp.json` from a ConfigMap of the system namespace onto
its node, and the kubelet loads it for the agent container at its start: a rewritten ConfigMap (an
allow-all profile) unconfines every agent at its next restart, and no admission rule or digest covers
a ConfigMap. This compares the profile in each ConfigMap the agent's DaemonSet mounts with the shipped
one, by the SHA-256 of its JSON with sorted keys and no whitespace (formatting is not content).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from coroner.cli.doctor.outcome import Check, failed, kubectl_name, object_name, passed, unknown
from coroner.cli.plan import Unreadable

#: The profile's key in the ConfigMap (manifests/base/kustomization.yaml's configMapGenerator).
PROFILE_KEY: Final = "agent-seccomp.json"
#: `profile_digest` of manifests/base/agent-seccomp.json; tests/unit/test_doctor_seccomp.py fails until
#: this is the file's (re-measure the profile, then set this to what the test prints).
SHIPPED_PROFILE_SHA256: Final = "9d03d4f84dc8409da70e5b9e6027a6c990f838fb2badb7fccfc017101856fa36"
#: The agent DaemonSet's name without a release's namePrefix.
AGENT_DAEMONSET: Final = "coroner-agent"


def profile_digest(text: str) -> str | None:
    """SHA-256 of the profile's JSON, keys sorted, no whitespace; None where it is no JSON object."""
    try:
        parsed = json.loads(text)
    except ValueError:
        return None
    if not isinstance(parsed, dict):
        return None
    return hashlib.sha256(json.dumps(parsed, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _mounted_configmaps(daemonset: Mapping[str, Any]) -> list[str]:
    spec = ((daemonset.get("spec") or {}).get("template") or {}).get("spec") or {}
    names = []
    for volume in spec.get("volumes") or []:
        source = volume.get("configMap")
        if isinstance(source, Mapping) and source.get("name"):
            names.append(str(source["name"]))
    return names


def check_agent_seccomp(
    *,
    daemonsets: Sequence[Mapping[str, Any]] | Unreadable,
    configmaps: Sequence[Mapping[str, Any]] | Unreadable,
    system_namespace: str,
) -> Check:
    """FAIL naming each ConfigMap mounted by the agent's DaemonSet whose `agent-seccomp.json` is not the
    shipped profile (or that is missing); UNKNOWN where either could not be listed."""
    name = "agent-seccomp"
    for listed, kind in ((daemonsets, "DaemonSets"), (configmaps, "ConfigMaps")):
        if isinstance(listed, Unreadable):
            return unknown(name, f"the {kind} of namespace {system_namespace} could not be read: {listed.reason}")
    assert not isinstance(daemonsets, Unreadable) and not isinstance(configmaps, Unreadable)
    agents = [ds for ds in daemonsets if object_name(ds).endswith(AGENT_DAEMONSET)]
    if not agents:
        return passed(name, f"no agent DaemonSet in namespace {system_namespace}, so no agent to confine.")
    by_name = {object_name(cm): cm for cm in configmaps}
    differing: dict[str, str] = {}
    checked: list[str] = []
    for daemonset in agents:
        for configmap in _mounted_configmaps(daemonset):
            body = by_name.get(configmap)
            where = f"ConfigMap/{system_namespace}/{configmap}"
            if body is None:
                differing[where] = f"missing (DaemonSet {object_name(daemonset)} mounts it)"
                continue
            data = body.get("data") or {}
            if PROFILE_KEY not in data:
                continue
            checked.append(where)
            if profile_digest(str(data[PROFILE_KEY])) != SHIPPED_PROFILE_SHA256:
                differing[where] = f"its {PROFILE_KEY} is not the shipped profile"
    if differing:
        described = "; ".join(f"{where}: {why}" for where, why in sorted(differing.items()))
        return failed(
            name,
            f"the agent's seccomp profile is not the shipped one, so every agent restarted from now on runs "
            f"under it: {described}. Re-apply the manifests (or helm upgrade), then restart the agents "
            f"(kubectl -n {system_namespace} rollout restart daemonset).",
            objects=sorted(differing),
            facts={"configMaps": differing, "expectedSha256": SHIPPED_PROFILE_SHA256},
            names=[kubectl_name("ConfigMap", where.rsplit("/", 1)[1]) for where in sorted(differing)],
        )
    if not checked:
        return failed(
            name,
            f"the agent DaemonSet in namespace {system_namespace} mounts no ConfigMap with {PROFILE_KEY}: its "
            "profile cannot be verified. Re-apply the manifests.",
            objects=[f"DaemonSet/{system_namespace}/{object_name(ds)}" for ds in agents],
            names=[kubectl_name("DaemonSet", object_name(ds)) for ds in agents],
        )
    return passed(
        name,
        f"the agent's seccomp profile is the shipped one ({', '.join(checked)}).",
        facts={"configMaps": checked, "expectedSha256": SHIPPED_PROFILE_SHA256},
    )
