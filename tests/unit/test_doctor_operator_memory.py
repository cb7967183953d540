"""Doctor's operator-memory check (coroner.cli.doctor.operator_memory), table-driven on raw Pods and
/metrics texts as the API server returns them; and that doctor reads and runs it."""

from __future__ import annotations

from typing import Any

import pytest

from coroner.cli import doctor
from coroner.cli.doctor import operator_memory
from coroner.cli.plan import Unreadable

pytestmark = pytest.mark.unit

NS = "coroner-system"
MiB = 1 << 20


def pod(
    name: str, *, limit: str | None = "512Mi", phase: str = "Running", port: bool = True, oom: bool = False
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "operator", "resources": {"limits": {"memory": limit}} if limit else {}}
    if port:
        container["ports"] = [{"name": "metrics", "containerPort": 8080}]
    status: dict[str, Any] = {"phase": phase}
    if oom:
        terminated = {"reason": "OOMKilled", "exitCode": 137, "finishedAt": "2026-12-06T22:00:00Z"}
        status["containerStatuses"] = [
            {"name": "operator", "state": {"running": {}}, "lastState": {"terminated": terminated}}
        ]
    return {"metadata": {"name": name, "namespace": NS}, "spec": {"containers": [container]}, "status": status}


def metrics(mib: float) -> str:
    return (
        "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
        "# TYPE process_resident_memory_bytes gauge\n"
        f"process_resident_memory_bytes {mib * MiB:.1f}\n"
        "process_virtual_memory_bytes 1.0e+09\n"
    )


def check(pods: Any, read: dict[str, Any]) -> doctor.Check:
    return operator_memory.check_operator_memory(pods=pods, metrics=read, system_namespace=NS)


@pytest.mark.parametrize(
    ("quantity", "expected"),
    [
        ("512Mi", 512 * MiB),
        ("1Gi", 1 << 30),
        ("1.5Gi", 3 << 29),
        ("500M", 500_000_000),
        ("1e9", 1_000_000_000),
        ("134217728", 134217728),
        (268435456, 268435456),
        ("lots", None),
        (None, None),
        (True, None),
    ],
)
def test_memory_quantities(quantity: object, expected: int | None) -> None:
    assert operator_memory.memory_bytes(quantity) == expected


def test_both_replicas_under_the_bound_pass_with_their_numbers() -> None:
    result = check([pod("op-b"), pod("op-a")], {"op-a": metrics(131), "op-b": metrics(120)})
    assert result.status == doctor.CheckStatus.PASS, result.summary
    assert "Pod coroner-system/op-a uses 131 MiB of its 512 MiB limit (26%)" in result.summary
    assert result.summary.index("op-a") < result.summary.index("op-b")
    assert result.facts["coroner-system/op-a"] == {"residentBytes": 131 * MiB, "limitBytes": 512 * MiB}


@pytest.mark.parametrize("mib", [410, 500, 600])
def test_from_80_percent_of_the_limit_it_warns_naming_the_pod_and_the_fix(mib: float) -> None:
    result = check([pod("op-a"), pod("op-b")], {"op-a": metrics(mib), "op-b": metrics(100)})
    assert result.status == doctor.CheckStatus.WARN, result.summary
    assert result.objects == ("pod/coroner-system/op-a",) and result.kubectl_names() == ("pod/op-a",)
    assert "doctor warns from 80%" in result.summary and "operator.resources.limits.memory" in result.summary
    assert "docs/operations.md" in result.summary


def test_just_under_80_percent_passes() -> None:
    assert check([pod("op-a")], {"op-a": metrics(409)}).status == doctor.CheckStatus.PASS


def test_an_oom_kill_warns_whatever_it_uses_now() -> None:
    result = check([pod("op-a", oom=True)], {"op-a": metrics(90)})
    assert result.status == doctor.CheckStatus.WARN
    assert "OOMKilled (finished 2026-12-06T22:00:00Z)" in result.summary


def test_no_limit_is_nothing_to_near() -> None:
    result = check([pod("op-a", limit=None)], {"op-a": metrics(900)})
    assert result.status == doctor.CheckStatus.PASS and "no memory limit" in result.summary


@pytest.mark.parametrize(
    ("pods", "read", "said"),
    [
        pytest.param(
            Unreadable(reason="403 Forbidden"), {}, "could not be listed: 403 Forbidden", id="pods-unreadable"
        ),
        pytest.param([], {}, "no Pod labelled app.kubernetes.io/name=coroner-operator", id="no-pod"),
        pytest.param(
            [pod("op-a")], {"op-a": Unreadable(reason="forbidden to get pods/proxy")}, "forbidden", id="proxy-refused"
        ),
        pytest.param([pod("op-a", port=False)], {}, "not Running with a container port named metrics", id="no-port"),
        pytest.param([pod("op-a", phase="Pending")], {}, "not Running", id="pending"),
        pytest.param([pod("op-a")], {"op-a": "up 1\n"}, "has no process_resident_memory_bytes", id="no-series"),
        pytest.param(
            [pod("op-a"), pod("op-b")],
            {"op-a": metrics(100)},
            "Pod coroner-system/op-b not measured",
            id="one-unmeasured",
        ),
    ],
)
def test_what_could_not_be_measured_is_unknown_never_a_pass(pods: Any, read: dict[str, Any], said: str) -> None:
    result = check(pods, read)
    assert result.status == doctor.CheckStatus.UNKNOWN and said in result.summary, result.summary


def test_a_warning_is_not_hidden_by_an_unmeasured_replica() -> None:
    result = check([pod("op-a"), pod("op-b", phase="Pending")], {"op-a": metrics(500)})
    assert result.status == doctor.CheckStatus.WARN and "op-b not measured" in result.summary


def test_only_running_pods_with_a_metrics_port_are_read() -> None:
    assert operator_memory.metrics_port(pod("a")) == 8080
    assert operator_memory.metrics_port(pod("a", phase="Pending")) is None
    assert operator_memory.metrics_port(pod("a", port=False)) is None


def test_doctor_runs_it_after_the_operators_lease_checks() -> None:
    names = [c.__code__.co_names for c in doctor.CHECKS]
    position = next(i for i, used in enumerate(names) if "check_operator_memory" in used)
    assert "check_last_sweep" in names[position - 1]
