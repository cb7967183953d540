"""``kubectl coroner doctor``: PASS / WARN / FAIL / UNKNOWN for each part Coroner needs.

This module reads; the checks are the pure `coroner.cli.doctor.CHECKS`, run on what was read.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import click
import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from coroner.cli import doctor as diagnosis
from coroner.cli import options, render
from coroner.cli import plan as planning
from coroner.cli.doctor import injection, operator_memory
from coroner.cli.session import EXIT_OK, Connection, PluginError, Session, fail, lease_policy, utcnow
from coroner.core import admission_digest, api, fingerprint
from coroner.core.fingerprint import Plan
from coroner.core.held import HELD_GRACE_SECONDS
from coroner.core.world import World


@click.command("doctor")
@options.output
@click.option(
    "--expect-plan-only",
    is_flag=True,
    help="The cluster is deliberately plan-only: the operator should NOT hold retire.",
)
@click.option(
    "--attestation-grace-seconds",
    type=float,
    default=60.0,
    show_default=True,
    help="A registration unattested for longer than this counts as stuck.",
)
@click.option(
    "--held-grace-seconds",
    type=click.FloatRange(min=0),
    default=HELD_GRACE_SECONDS,
    show_default=True,
    callback=options.finite,
    help="A registration held Active longer than this by a reason that may last for ever (PidReuseDetected, "
    "LivenessUnknown, AttestationStale, ...: check held) is named (WARN).",
)
@options.common
@click.pass_context
def doctor_command(
    ctx: click.Context,
    output: str,
    expect_plan_only: bool,
    attestation_grace_seconds: float,
    held_grace_seconds: float,
    connection: Connection,
    system_namespace: str,
    node_deletion_evidence: bool | None,
    node_quarantine_seconds: float | None,
) -> None:
    """PASS / WARN / FAIL / UNKNOWN for each part Coroner needs; exit code 1 if any check FAILs."""
    session = Session(connection)
    extensions = k8s.ApiextensionsV1Api(session.client)
    admission = k8s.AdmissionregistrationV1Api(session.client)
    coordination = k8s.CoordinationV1Api(session.client)

    crd = session.read(
        extensions.read_custom_resource_definition, api.CRD_NAME, what=f"get CustomResourceDefinition {api.CRD_NAME}"
    )
    # The kinds the operator verifies before it retires (coroner.core.admission_digest.KINDS), and
    # those only an older release installed (diagnosis.RETIRED_ADMISSION_OBJECTS): an API server
    # that does not serve them (404) has none left.
    listings = {
        "ValidatingAdmissionPolicy": admission.list_validating_admission_policy,
        "ValidatingAdmissionPolicyBinding": admission.list_validating_admission_policy_binding,
    }
    assert tuple(listings) == admission_digest.KINDS
    leftover_listings = {
        "MutatingAdmissionPolicy": admission.list_mutating_admission_policy,
        "MutatingAdmissionPolicyBinding": admission.list_mutating_admission_policy_binding,
    }
    admission_objects = {
        kind: session.read_list(call, what=f"list {diagnosis.plural_of(kind)}") for kind, call in listings.items()
    } | {
        kind: session.read_list(call, what=f"list {diagnosis.plural_of(kind)}", not_served=[])
        for kind, call in leftover_listings.items()
    }
    operator_lease = session.read(
        coordination.read_namespaced_lease,
        planning.OPERATOR_LEASE,
        system_namespace,
        what=f"get Lease {system_namespace}/{planning.OPERATOR_LEASE}",
    )
    choice = lease_policy(
        operator_lease,
        system_namespace=system_namespace,
        node_deletion_evidence=node_deletion_evidence,
        node_quarantine_seconds=node_quarantine_seconds,
    )
    nodes = session.read_list(k8s.CoreV1Api(session.client).list_node, what="list nodes")
    leases = session.read_list(coordination.list_lease_for_all_namespaces, what="list leases in every namespace")

    deployments = session.read_list(
        k8s.AppsV1Api(session.client).list_namespaced_deployment,
        system_namespace,
        what=f"list deployments in namespace {system_namespace}",
    )
    operator_pods = session.read_list(
        functools.partial(
            k8s.CoreV1Api(session.client).list_namespaced_pod, label_selector=operator_memory.OPERATOR_POD_SELECTOR
        ),
        system_namespace,
        what=f"list the operator's pods in namespace {system_namespace}",
    )
    # The reviews are of the operator's own user: as its Lease states it, else its Deployment's
    # ServiceAccount (a Helm namePrefix renames it).
    operator_user = diagnosis.operator_identity(
        deployments, system_namespace=system_namespace, lease=operator_lease
    ).user
    cluster_wide = (
        None
        if operator_user is None
        else session.operator_may_retire(user=operator_user, system_namespace=system_namespace, namespace=None)
    )
    plan: Plan | planning.Unreadable
    world: World | planning.Unreadable
    per_namespace: dict[str, bool | None] = {}
    listed = World(system_namespace=system_namespace, intern=sys.intern, keep_bodies=False)
    try:
        session.cache_registrations(listed, namespace=None)
    except PluginError as exc:
        if exc.unreachable:
            raise
        plan = world = planning.Unreadable(reason=exc.message)
    else:
        for ns in listed.namespaces():
            if cluster_wide or operator_user is None:
                per_namespace[ns] = cluster_wide
            else:
                per_namespace[ns] = session.operator_may_retire(
                    user=operator_user, system_namespace=system_namespace, namespace=ns
                )
        if isinstance(leases, planning.Unreadable) or isinstance(nodes, planning.Unreadable):
            missing = leases if isinstance(leases, planning.Unreadable) else nodes
            assert isinstance(missing, planning.Unreadable)
            plan = world = planning.Unreadable(reason=f"the facts to decide them could not be read: {missing.reason}")
        else:
            # Decided with the operator's permission, so the counts are the operator's view.
            listing = planning.Listing(
                registrations=listed,
                leases=leases,
                nodes=nodes,
                retire_permission=per_namespace,
                system_namespace=system_namespace,
            )
            world = planning.build_world(listing)
            plan = fingerprint.decide_all(world=world, policy=choice.policy, now=utcnow(), keep_evidence=False)

    rbac_api = k8s.RbacAuthorizationV1Api(session.client)
    rbac_lists: dict[str, list[dict[str, Any]]] = {}
    rbac: diagnosis.Rbac | planning.Unreadable | None = None
    for field, call in (
        ("cluster_roles", rbac_api.list_cluster_role),
        ("cluster_role_bindings", rbac_api.list_cluster_role_binding),
        ("roles", rbac_api.list_role_for_all_namespaces),
        ("role_bindings", rbac_api.list_role_binding_for_all_namespaces),
    ):
        items = session.read_list(call, what=f"list {field.replace('_', '')}")
        if isinstance(items, planning.Unreadable):
            rbac = items
            break
        rbac_lists[field] = items
    if rbac is None:
        rbac = diagnosis.Rbac(**rbac_lists)

    mutating_webhooks = session.read_list(
        admission.list_mutating_webhook_configuration, what="list mutatingwebhookconfigurations"
    )
    apps = k8s.AppsV1Api(session.client)
    system_daemonsets = session.read_list(
        apps.list_namespaced_daemon_set, system_namespace, what=f"list daemonsets in namespace {system_namespace}"
    )
    system_configmaps = session.read_list(
        k8s.CoreV1Api(session.client).list_namespaced_config_map,
        system_namespace,
        what=f"list configmaps in namespace {system_namespace}",
    )

    injection_pods = session.read_list(
        functools.partial(
            k8s.CoreV1Api(session.client).list_pod_for_all_namespaces, label_selector=injection.INJECT_SELECTOR
        ),
        what=f"list pods labelled {injection.INJECT_SELECTOR} in every namespace",
    )

    now = utcnow()
    checks = diagnosis.run_checks(
        diagnosis.Findings(
            crd=crd,
            admission=admission_objects,
            operator_lease=operator_lease,
            operator_deployments=deployments,
            nodes=nodes,
            leases=leases,
            world=world,
            plan=plan,
            cluster_wide=cluster_wide,
            per_namespace=per_namespace,
            policy=choice,
            system_namespace=system_namespace,
            expect_plan_only=expect_plan_only,
            attestation_grace_seconds=attestation_grace_seconds,
            held_grace_seconds=held_grace_seconds,
            now=now,
            operator_pods=operator_pods,
            operator_metrics=_operator_metrics(session, operator_pods, system_namespace=system_namespace),
            rbac=rbac,
            mutating_webhooks=mutating_webhooks,
            system_daemonsets=system_daemonsets,
            system_configmaps=system_configmaps,
            injection_pods=injection_pods,
        )
    )
    render.emit(
        output,
        document=lambda: render.doctor_document(checks, now=now, policy=choice),
        table=lambda console, wide: render.render_doctor(checks, console=console, policy=choice, wide=wide),
        names=render.doctor_names(checks),
    )
    warning = [check.name for check in checks if check.status == diagnosis.CheckStatus.WARN]
    if warning:  # not a failure (exit 0), but never silent: stderr says it after the document
        click.echo(f"warning: doctor: check(s) {', '.join(warning)} warn (see above).", err=True)
    code = diagnosis.doctor_exit_code(checks)
    if code != EXIT_OK:
        failing = [check.name for check in checks if check.status == diagnosis.CheckStatus.FAIL]
        fail(ctx, f"doctor: check(s) {', '.join(failing)} failed.", code=code)


#: Seconds to wait for one operator Pod's /metrics through the API server: a NetworkPolicy that drops
#: the API server's connection costs this much per Pod, and the check says UNKNOWN.
METRICS_TIMEOUT_SECONDS = 10.0


def _operator_metrics(
    session: Session, pods: list[dict[str, Any]] | planning.Unreadable, *, system_namespace: str
) -> dict[str, str | planning.Unreadable]:
    """Each Running operator Pod's /metrics text, read through the API server's Pod proxy (so no
    metrics-server is needed); a failed read is `Unreadable`, never fatal: the check says UNKNOWN."""
    read: dict[str, str | planning.Unreadable] = {}
    # Not preloaded, the client returns the raw response (its annotations say str).
    proxy: Callable[..., Any] = k8s.CoreV1Api(session.client).connect_get_namespaced_pod_proxy_with_path
    for pod in [] if isinstance(pods, planning.Unreadable) else pods:
        port = operator_memory.metrics_port(pod)
        name = str((pod.get("metadata") or {}).get("name") or "")
        if port is None or not name:
            continue
        what = f"get /metrics of pod {system_namespace}/{name} through the API server (pods/proxy)"
        try:
            response = proxy(
                f"{name}:{port}",
                system_namespace,
                "metrics",
                _preload_content=False,
                _request_timeout=METRICS_TIMEOUT_SECONDS,
            )
        except ApiException as exc:
            read[name] = planning.Unreadable(reason=session.api_error(exc, what=what).message)
        except urllib3.exceptions.HTTPError as exc:
            read[name] = planning.Unreadable(reason=f"cannot {what}: {exc}")
        else:
            read[name] = response.data.decode("utf-8", "replace")
    return read
