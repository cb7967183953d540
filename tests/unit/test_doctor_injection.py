"""Doctor's `registrar-injection` check on raw objects: labelled Pods without the registrar, the policy
their label needs, and running containers of injected Pods with no registration."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from coroner.cli.doctor import CheckStatus, check_registrar_injection
from coroner.cli.doctor.injection import POLICY, REGISTRATION_GRACE_SECONDS
from coroner.cli.plan import Unreadable
from coroner.core import inject
from coroner.core.model import format_time
from unit.builders import cached, make_registration

NOW = datetime.datetime(2026, 12, 6, 12, 0, tzinfo=datetime.UTC)
CID = "3f2a9c1e7b5d" + "0" * 52
POLICIES = [{"metadata": {"name": POLICY}}]
BINDINGS = [{"metadata": {"name": POLICY}, "spec": {"policyName": POLICY}}]


def pod(
    name: str,
    *,
    injected: bool = True,
    phase: str = "Running",
    started: datetime.datetime | None = NOW - datetime.timedelta(minutes=5),
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "worker", "image": "registry.example/worker:1"}]}
    if injected:
        spec = inject.inject({"apiVersion": "v1", "kind": "Pod", "metadata": {}, "spec": spec})["spec"]
    status: dict[str, Any] = {"phase": phase}
    if started is not None:
        status["containerStatuses"] = [
            {
                "name": "worker",
                "containerID": f"containerd://{CID}",
                "state": {"running": {"startedAt": format_time(started)}},
            }
        ]
    return {
        "metadata": {"name": name, "namespace": "jobs", "labels": {inject.INJECT_LABEL: "true"}},
        "spec": spec,
        "status": status,
    }


def registered(pod_name: str) -> dict[str, Any]:
    return make_registration(
        namespace="jobs", name=inject.registration_name(pod_name=pod_name, container=CID, start_time=1234)
    )


def check(pods: Any, *, policies: Any = POLICIES, bindings: Any = BINDINGS, registrations: Any = ()) -> Any:
    world = registrations if isinstance(registrations, Unreadable) else cached(list(registrations))
    return check_registrar_injection(pods=pods, policies=policies, bindings=bindings, world=world, now=NOW)


def test_no_labelled_pod_passes_whether_or_not_the_policy_is_installed() -> None:
    assert check([], policies=[], bindings=[]).status == CheckStatus.PASS
    assert check([pod("done", phase="Succeeded", injected=False)]).status == CheckStatus.PASS


def test_labelled_pods_with_the_registrar_and_registered_pass() -> None:
    result = check([pod("web-1")], registrations=[registered("web-1")])
    assert result.status == CheckStatus.PASS, result.summary
    assert POLICY in result.summary


@pytest.mark.parametrize(
    ("policies", "bindings", "why"),
    [
        ([], [], f"MutatingAdmissionPolicy {POLICY} is not installed"),
        (POLICIES, [], "has no binding"),
        (POLICIES, BINDINGS, "was not yet installed or enforced when they were created"),
    ],
)
def test_a_labelled_pod_without_the_registrar_fails_by_name_with_why_and_the_fix(
    policies: Any, bindings: Any, why: str
) -> None:
    result = check([pod("web-1"), pod("web-2", injected=False)], policies=policies, bindings=bindings)
    assert result.status == CheckStatus.FAIL
    assert "1 of 2 Pod(s)" in result.summary and "jobs/web-2" in result.summary and "web-1" not in result.summary
    assert why in result.summary and "recreate them" in result.summary
    assert ("registrar-injection (Helm: registrarInjection.enabled=true)" in result.summary) == bool(
        why != "was not yet installed or enforced when they were created"
    )
    assert result.objects == ("Pod/jobs/web-2",) and result.kubectl_names() == ("pod/web-2",)


def test_the_policy_missing_while_labelled_pods_run_warns_the_next_one_may_be_unregistered() -> None:
    # Their manifests may have been injected offline: WARN, not FAIL.
    result = check([pod("web-1")], policies=[], bindings=[], registrations=[registered("web-1")])
    assert result.status == CheckStatus.WARN
    assert "not installed" in result.summary and "next such Pod" in result.summary
    assert result.kubectl_names() == (f"mutatingadmissionpolicy.admissionregistration.k8s.io/{POLICY}",)


def test_a_running_container_with_no_registration_past_the_grace_warns_with_the_registrars_log() -> None:
    result = check([pod("web-1")])
    assert result.status == CheckStatus.WARN
    assert "container worker of Pod jobs/web-1" in result.summary
    assert "kubectl logs -n jobs web-1 -c coroner-registrar" in result.summary
    # Within the grace, or not running: the registrar is still at it, nothing to say.
    young = pod("web-1", started=NOW - datetime.timedelta(seconds=REGISTRATION_GRACE_SECONDS - 1))
    assert check([young]).status == CheckStatus.PASS
    assert check([pod("web-1", started=None)]).status == CheckStatus.PASS
    # A registration of another container (or another Pod) does not count.
    assert check([pod("web-1")], registrations=[registered("web-2")]).status == CheckStatus.WARN


def test_what_could_not_be_read_is_unknown_never_a_pass() -> None:
    assert check(Unreadable(reason="forbidden")).status == CheckStatus.UNKNOWN
    assert check([pod("web-1")], registrations=Unreadable(reason="forbidden")).status == CheckStatus.UNKNOWN
    unread = check([pod("web-1")], policies=Unreadable(reason="forbidden"), registrations=[registered("web-1")])
    assert unread.status == CheckStatus.UNKNOWN and "forbidden" in unread.summary
    # A labelled Pod without the registrar is a failure whatever else could not be read.
    assert check([pod("web-1", injected=False)], policies=Unreadable(reason="x")).status == CheckStatus.FAIL
