"""Names of the `coroner.dev` API, in one place.

Every component (operator, agent, launcher, CLI, manifests' tests) spells the group, the resource
and the field paths through these constants, so one word means one thing everywhere.
"""

from __future__ import annotations

from typing import Final

GROUP: Final = "coroner.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "WorkerRegistration"
PLURAL: Final = "workerregistrations"
CRD_NAME: Final = f"{PLURAL}.{GROUP}"

#: The label every registration carries so that an agent watches only its own node server-side.
NODE_LABEL: Final = f"{GROUP}/node"
#: The RBAC verb that is the retire capability.
RETIRE_VERB: Final = "retire"
#: The prefix of a launcher-minted clientInstanceId (anything else is UntrustedIdentityProvenance).
CLIENT_INSTANCE_PREFIX: Final = "inst-"
#: Namespace the manifests install into.
SYSTEM_NAMESPACE: Final = "coroner-system"
#: Per-node agent Leases live in SYSTEM_NAMESPACE and are named AGENT_LEASE_PREFIX + nodeName.
#: The node label the agent DaemonSet's affinity avoids (manifests/base/agent.yaml): a node that
#: carries it runs no agent by design, and needs one only when registrations are on it.
CONTROL_PLANE_LABEL: Final = "node-role.kubernetes.io/control-plane"
AGENT_LEASE_PREFIX: Final = "coroner-agent-"
#: Annotations on the agent Lease that publish the node facts the agent read.
AGENT_LEASE_BOOT_ID: Final = f"{GROUP}/boot-id"
AGENT_LEASE_HOST_ID: Final = f"{GROUP}/host-id"

#: The Node taint (KEP-2268) by which a human declares a node shut down for good.
OUT_OF_SERVICE_TAINT: Final = "node.kubernetes.io/out-of-service"

#: The end of the 403 a (re)starting API server's admission answers every write until its policies
#: have synced (k8s.io/apiserver admission/plugin/policy/generic: "<resource> "<name>" is forbidden:
#: not yet ready to handle request"), whatever the requester may do: a moment to wait out, never a
#: revocation or a policy's refusal (`coroner.retire.outcome_of_write`, `coroner.client.rest.warming_up`).
ADMISSION_NOT_READY: Final = "not yet ready to handle request"

#: The kernel's fixed inode of the root (initial) pid namespace: PROC_PID_INIT_INO.
ROOT_PID_NAMESPACE_INODE: Final = 4026531836
#: The kernel's upper bound for pid_max (PID_MAX_LIMIT on 64-bit).
PID_MAX_LIMIT: Final = 4194304
#: The operator's own Lease in SYSTEM_NAMESPACE, renewed after every sweep; doctor reads it.
OPERATOR_LEASE: Final = "coroner-operator"
#: The ServiceAccount the manifests run the operator as; a Helm release prefixes it (namePrefix).
OPERATOR_SERVICE_ACCOUNT: Final = "coroner-operator"
#: Annotation on OPERATOR_LEASE holding the last sweep's outcome (JSON, per-namespace failures).
LAST_SWEEP_ANNOTATION: Final = f"{GROUP}/last-sweep"
#: Annotation on OPERATOR_LEASE holding the decision Policy the operator runs with (JSON, every
#: field of coroner.core.decision.Policy under its camelCase name; see coroner.core.policy_json). Written at
#: startup and with every sweep; `kubectl coroner plan|apply|doctor` decide with it.
POLICY_ANNOTATION: Final = f"{GROUP}/policy"
#: Annotation on OPERATOR_LEASE holding the operator's own user name, as its SelfSubjectReview at
#: startup answered it (``system:serviceaccount:<namespace>:<namePrefix>coroner-operator`` in a
#: cluster). Written with the policy; `kubectl coroner doctor` reads the operator's user (and so a Helm
#: release's namePrefix, `name_prefix_of`) from it first. Only the operator may write that Lease
#: (admission policy coroner-system-leases-by-owner), and doctor only reports with it.
OPERATOR_USER_ANNOTATION: Final = f"{GROUP}/operator-user"
#: Annotation on a WorkerRegistration: who registered it, as admission spells the requester
#: (``coroner.core.kubewire.registrant``). The launcher writes it; the admission policy
#: coroner-registrant-recorded refuses a create whose value is not the requester (or that has
#: none), and any change.
REGISTERED_BY_ANNOTATION: Final = f"{GROUP}/registered-by"


def name_prefix_of(user: str, *, system_namespace: str | None = None) -> str:
    """The Helm chart's namePrefix read off the operator's user
    (``system:serviceaccount:<namespace>:<prefix>coroner-operator``, its namespace `system_namespace`
    when given): the admission policies name the operator's and the agent's ServiceAccounts with it.
    "" for the manifests' name and for any other user."""
    parts = user.split(":")
    if len(parts) != 4 or parts[:2] != ["system", "serviceaccount"]:
        return ""
    if system_namespace is not None and parts[2] != system_namespace:
        return ""
    return parts[3].removesuffix(OPERATOR_SERVICE_ACCOUNT) if parts[3].endswith(OPERATOR_SERVICE_ACCOUNT) else ""


def admission_not_ready(status: int | None, message: str) -> bool:
    """Whether an answer is the (re)starting admission's 403 ADMISSION_NOT_READY: the one test of it."""
    return status == 403 and message.endswith(ADMISSION_NOT_READY)
