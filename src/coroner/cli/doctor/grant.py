"""Doctor's RBAC check: does the operator hold the ``retire`` verb, as the cluster is meant to be.

The operator is the one in the system namespace doctor is pointed at, and its user is the one it
states on its own Lease (`api.OPERATOR_USER_ANNOTATION`, which `coroner-planner` may read), else the
ServiceAccount its Deployment runs as: a Helm release with ``namePrefix`` runs it as
``<prefix>coroner-operator`` and binds ``<prefix>coroner-operator-retire`` to that, so the manifests'
name would review someone else's grant.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Final

from coroner.cli.doctor.outcome import Check, failed, object_name, passed, unknown, user_object_names
from coroner.cli.plan import OPERATOR_LEASE, Unreadable, names_text
from coroner.core import api

#: The label of the operator's pods in the manifests and the chart (whatever the prefix).
OPERATOR_APP_LABEL: Final = ("app.kubernetes.io/name", "coroner-operator")


@dataclasses.dataclass(frozen=True, kw_only=True)
class OperatorIdentity:
    """Whom doctor reviews as the operator, and how it learned that."""

    user: str | None
    """``system:serviceaccount:NS:NAME``; None: the Deployments disagree, so it is not known."""
    source: str
    """How it was learned, a phrase for the check's line."""
    stated: bool = False
    """Learned from the operator's own Lease (the operator said who it is)."""

    @property
    def name_prefix(self) -> str:
        """The Helm chart's namePrefix this operator was installed with ("" for the manifests' names, and
        where the user is not known): the admission policies name its ServiceAccounts with it."""
        return api.name_prefix_of(self.user or "")


def operator_identity(
    deployments: Sequence[Mapping[str, Any]] | Unreadable,
    *,
    system_namespace: str,
    lease: Mapping[str, Any] | Unreadable | None = None,
) -> OperatorIdentity:
    """The operator's user, in this order: as it states it on its own `lease` (`api.OPERATOR_USER_ANNOTATION`,
    written at startup from its SelfSubjectReview; only the operator may write that Lease: admission
    policy coroner-system-leases-by-owner); else the ServiceAccount of the Deployment(s) in
    `system_namespace` whose pods carry `OPERATOR_APP_LABEL`; else the manifests' name, where there
    is none or they cannot be read. `source` says which."""
    stated = _stated_user(lease)
    if stated is not None:
        return OperatorIdentity(
            user=stated,
            source=f"as the operator states it on Lease {system_namespace}/{OPERATOR_LEASE} "
            f"({api.OPERATOR_USER_ANNOTATION})",
            stated=True,
        )
    if isinstance(deployments, Unreadable):
        return OperatorIdentity(
            user=_user(system_namespace, api.OPERATOR_SERVICE_ACCOUNT),
            source=f"is the manifests' name: the Deployments of {system_namespace} could not be read "
            f"({deployments.reason})",
        )
    accounts: dict[str, list[str]] = {}
    for deployment in deployments:
        template = (deployment.get("spec") or {}).get("template") or {}
        labels = (template.get("metadata") or {}).get("labels") or {}
        if labels.get(OPERATOR_APP_LABEL[0]) == OPERATOR_APP_LABEL[1]:
            # No serviceAccountName: its pods run as the namespace's "default" ServiceAccount.
            account = str((template.get("spec") or {}).get("serviceAccountName") or "default")
            accounts.setdefault(account, []).append(object_name(deployment))
    if not accounts:
        return OperatorIdentity(
            user=_user(system_namespace, api.OPERATOR_SERVICE_ACCOUNT),
            source=f"is the manifests' name: no operator Deployment in {system_namespace}",
        )
    if len(accounts) > 1:
        described = "; ".join(f"{', '.join(names)} as {account}" for account, names in sorted(accounts.items()))
        return OperatorIdentity(
            user=None,
            source=f"is not known: the operator Deployments of {system_namespace} run as different "
            f"ServiceAccounts ({described})",
        )
    ((account, names),) = accounts.items()
    return OperatorIdentity(
        user=_user(system_namespace, account), source=f"from Deployment {system_namespace}/{', '.join(names)}"
    )


def _stated_user(lease: Mapping[str, Any] | Unreadable | None) -> str | None:
    """The user the operator wrote on its Lease; None where the Lease or the annotation is missing
    (an operator older than it), empty, or the Lease could not be read."""
    if lease is None or isinstance(lease, Unreadable):
        return None
    annotations = (lease.get("metadata") or {}).get("annotations") or {}
    user = annotations.get(api.OPERATOR_USER_ANNOTATION)
    return user.strip() if isinstance(user, str) and user.strip() else None


def _user(system_namespace: str, service_account: str) -> str:
    """A ServiceAccount's user name as the API server authenticates it."""
    return f"system:serviceaccount:{system_namespace}:{service_account}"


def check_retire_grant(
    *,
    cluster_wide: bool | None,
    per_namespace: Mapping[str, bool | None],
    expect_plan_only: bool,
    system_namespace: str,
    operator_deployments: Sequence[Mapping[str, Any]] | Unreadable = (),
    operator_lease: Mapping[str, Any] | Unreadable | None = None,
    unknown_reason: str = "",
) -> Check:
    """Whether the operator holds ``retire`` (SubjectAccessReview), against what was expected.

    `cluster_wide` answers for every namespace; `per_namespace` for those holding registrations
    (a grant may be a RoleBinding). None means the review could not be made. The reviews are of
    `operator_identity(operator_deployments, lease=operator_lease)`, the user this check names.
    """
    name = "retire-grant"
    identity = operator_identity(operator_deployments, system_namespace=system_namespace, lease=operator_lease)
    if identity.user is None:
        return unknown(
            name, f"cannot tell whose retire grant to review: the operator's ServiceAccount {identity.source}."
        )
    user = identity.user
    said = f" (the operator's ServiceAccount {identity.source})"
    if cluster_wide is None:
        return unknown(
            name,
            f"could not review whether {user} holds retire{': ' + unknown_reason if unknown_reason else ''} "
            f"(needs create on subjectaccessreviews){said}.",
        )
    lacking = sorted(ns for ns, allowed in per_namespace.items() if allowed is not True)
    unreviewed = sorted(ns for ns, allowed in per_namespace.items() if allowed is None)
    granted_everywhere = cluster_wide or not lacking
    facts = {
        "user": user,
        "userFrom": identity.source,
        "clusterWide": cluster_wide,
        "namespacesWithoutGrant": lacking,
        "expectPlanOnly": expect_plan_only,
    }
    if unreviewed:
        return unknown(
            name, f"could not review retire for {user} in namespace(s) {names_text(unreviewed)}{said}.", facts=facts
        )
    if expect_plan_only:
        if cluster_wide or (per_namespace and not lacking):
            return failed(
                name,
                f"{user} holds retire but the cluster is expected to be plan-only; remove the "
                f"retire-grant component (or run doctor without --expect-plan-only){said}.",
                objects=(user,),
                facts=facts,
                names=user_object_names(user),
            )
        return passed(name, f"{user} does not hold retire: plan-only, as expected{said}.", facts=facts)
    if cluster_wide:
        return passed(name, f"{user} holds retire in every namespace{said}.", facts=facts)
    if granted_everywhere and per_namespace:
        return passed(
            name,
            f"{user} holds retire in every namespace with registrations ({len(per_namespace)}){said}.",
            facts=facts,
        )
    where = f" in namespace(s) {names_text(lacking)}" if lacking else ""
    return failed(
        name,
        f"{user} does not hold retire{where}: the operator runs plan-only; grant it with the "
        f"retire-grant component (`kubectl apply -k manifests/overlays/production`; Helm: "
        f"retireGrant.enabled=true), or pass --expect-plan-only if that is intended{said}.",
        objects=(user,),
        facts=facts,
        names=user_object_names(user),
    )
