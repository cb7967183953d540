"""Session fixtures: one real control plane (etcd + kube-apiserver) for every integration test; and
the test lanes, by folder.

Set CORONER_TEST_CLUSTER_DIR to reuse a running dev cluster between runs (it is then left
running); otherwise a fresh one is started in a temporary directory and stopped at the end.

The lanes (README, "Development"): `make unit` runs `-m "unit and not sim"`; `make test` runs
`-m "not slow"` (every unit test, the simulation at 10,000 trials, and per feature the one
integration or e2e test that drives it end to end against the real API server, `QUICK` below);
`make check` runs everything.
Each folder's marker is set here, so a new test file is in its lane without marking itself:

- tests/unit: `unit`; so are the fault harness's pure parts (tests/faults without the `plane`);
- tests/sim: `sim` (the batch's size is `CORONER_SIM_TRIALS`, set by the Makefile per lane);
- tests/integration, tests/e2e: `integration`, `e2e`; `slow` unless named in `QUICK`;
- tests/faults (with its own fault plane): `integration` and `slow`;
- tests/node (the real node: root, cgroup v1): `node` and `slow`.
"""

from __future__ import annotations

import gc
import os
import pathlib
import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client as k8s

from coroner.client.kube import api_client
from coroner_dev.devcluster import cluster as cluster_mod
from coroner_dev.devcluster.cluster import Cluster
from support import kube


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    reuse = os.environ.get("CORONER_TEST_CLUSTER_DIR")
    directory = pathlib.Path(reuse) if reuse else tmp_path_factory.mktemp("cluster")
    started = cluster_mod.up(directory)
    try:
        yield started
    finally:
        if not reuse:
            cluster_mod.down(directory)


@pytest.fixture(scope="session")
def admin(cluster: Cluster) -> Iterator[k8s.ApiClient]:
    with api_client(cluster.kubeconfig) as client:
        yield client


@pytest.fixture(scope="session")
def coroner_api(cluster: Cluster) -> Cluster:
    """The CRD and admission policies installed (idempotent across the session)."""
    kube.install_api(cluster)
    return cluster


@pytest.fixture
def namespace(admin: k8s.ApiClient) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    core = k8s.CoreV1Api(admin)
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
    try:
        yield name
    finally:
        core.delete_namespace(name)


#: Per feature, the test that drives it end to end against the real API server: these run in
#: `make test`; every other integration and e2e test is `slow` (`make check`). A name without a
#: parameter takes every parametrization. Chosen by what each exercises, then by its measured time.
QUICK: dict[str, str] = {
    # the API itself: the CRD, its schema and admission of malformed registrations
    "the API": "integration/test_api.py::test_admission_refuses_malformed_registrations",
    "the CRD's printing": "integration/test_crd_conventions.py::test_default_and_wide_columns",
    "the control plane's semantics Coroner relies on": (
        "integration/test_control_plane.py::test_json_patch_with_failing_resource_version_test_is_rejected_and_changes_nothing"
    ),
    # the worker side
    "coroner run": "integration/test_launcher.py::test_clean_exit_releases_and_exit_status_is_the_childs",
    "ownership of registrations": (
        "integration/test_admission_ownership.py::test_a_worker_cannot_heartbeat_or_release_its_peers_registration"
    ),
    # the agent
    "the probe on real processes": "integration/test_probe_real.py::test_forced_pid_reuse_is_reused_never_dead_nor_alive",
    "the agent's client": "integration/test_rest.py::test_the_agent_api_lists_watches_and_attests_its_own_nodes_registrations",
    "the agent's health": (
        "integration/test_agent_health.py::test_the_real_agent_serves_metrics_and_stays_live_but_unready_without_the_api_server"
    ),
    "the agent's confinement": "integration/test_agent_confinement.py::test_the_real_agent_still_attests_under_the_profile",
    "the agent's drain": "integration/test_agent_node_loss.py::test_deaths_during_the_grace_are_attested_before_the_agent_exits",
    # the whole product: worker, agent and operator processes
    "kill -9 to Retired": "integration/test_end_to_end.py::test_kill_9_is_retired_by_pidfd_and_a_live_worker_is_not",
    "the operator": "integration/test_operator.py::test_pidfd_death_is_retired_with_an_event",
    "the operator's grant": "integration/test_operator.py::test_plan_only_until_granted_then_retires_without_restart",
    "reasons": "integration/test_reasons.py::test_reason_reached_for_real",
    "admission of retirements": "integration/test_admission_evidence.py::test_a_dead_attestation_of_exactly_this_incarnation_is_the_evidence",
    "who speaks as a node's agent": (
        "integration/test_agent_token_binding.py::test_a_node_bound_agent_token_neither_attests_nor_renews_a_lease"
    ),
    "admission refusals": "integration/test_admission_refusal.py::test_a_retirement_refused_by_admission_says_so_and_keeps_the_grant",
    "the operator's admission check": (
        "integration/test_operator_admission.py::test_a_weakened_or_missing_binding_stops_retirement_until_restored"
    ),
    "scale-down": "integration/test_scale_down.py::test_abrupt_loss_with_the_component_retires_after_the_quarantine",
    # kubectl coroner
    "plan and apply": (
        "integration/test_kubectl_plugin.py::test_apply_previews_then_retires_under_the_callers_identity_and_replays_idempotently"
    ),
    "doctor": (
        "integration/test_kubectl_plugin.py::test_doctor_reports_the_retire_grant_and_registrations_blocked_or_unattested"
    ),
    "an unreachable cluster": "integration/test_cli_unreachable.py::test_a_refused_connection_is_one_sentence",
    "registrar injection at admission": (
        "integration/test_registrar_injection.py::test_a_labelled_pod_gets_exactly_what_inject_adds_and_others_are_untouched"
    ),
    # what ships: manifests, chart, monitoring
    "the manifests": "e2e/test_manifests.py::test_worker_cannot_attest_or_retire_but_can_heartbeat_and_release",
    "least privilege": "e2e/test_least_privilege.py::test_rbac_grants_only_what_the_code_uses",
    "admission content": "e2e/test_admission_content.py::test_what_the_server_serves_is_what_ships_and_a_warn_only_binding_is_not",
    "the node-loss component": "e2e/test_node_loss_component.py::test_no_overlay_opts_in_by_default",
    "the chart": "integration/test_chart.py::test_the_chart_is_what_the_generator_makes_of_the_manifests",
    "monitoring": "integration/test_monitoring_rules.py::test_promtool_unit_tests_pass_and_cover_every_alert_firing_and_quiet",
}

_TESTS = pathlib.Path(__file__).resolve().parent
_QUICK_NAMES = frozenset(QUICK.values())


def _names(item: pytest.Item) -> tuple[str, str]:
    """The item as QUICK may name it: `folder/file.py::function`, and with its parameters."""
    path = pathlib.Path(str(item.path)).resolve().relative_to(_TESTS).as_posix()
    return f"{path}::{getattr(item, 'originalname', item.name)}", f"{path}::{item.name}"


def _lane_markers(item: pytest.Item) -> list[str]:
    """The markers an item's folder gives it."""
    folder = pathlib.Path(str(item.path)).resolve().relative_to(_TESTS).parts[0]
    if folder == "unit":
        return ["unit"]
    if folder == "sim":
        return ["sim"]
    if folder == "faults":  # the harness's own pure parts need no fault plane
        return ["integration", "slow"] if "plane" in getattr(item, "fixturenames", ()) else ["unit"]
    if folder == "node":
        return ["node", "slow"]
    if folder in ("integration", "e2e"):
        return [folder] if _QUICK_NAMES.intersection(_names(item)) else [folder, "slow"]
    return []


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    # A process a test started and dropped unreaped warns (an error here) when its Popen object is
    # collected. Collected at the end of each test that may start one, the error names the test that
    # leaked it, not whichever later test the collector happened to run in.
    if item.get_closest_marker("unit") is None:
        gc.collect()


def _worker_group(item: pytest.Item) -> str:
    """What one pytest-xdist worker runs together under `--dist loadgroup` (`make check`): a file, as
    its module fixtures (an install, an operator) expect; all of tests/faults, which shares one fault
    plane per process. Each worker starts its own control plane (the session fixture `cluster`)."""
    relative = pathlib.Path(str(item.path)).resolve().relative_to(_TESTS)
    return "faults" if relative.parts[0] == "faults" else relative.as_posix()


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by the markers set here, and before xdist reads groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for marker in _lane_markers(item):
            item.add_marker(marker)
        item.add_marker(pytest.mark.xdist_group(_worker_group(item)))
    # A name in QUICK that matches no test is a test renamed or gone: the fast lane must not lose a
    # feature silently. Checked when all of tests/integration and tests/e2e were collected.
    asked = {pathlib.Path(str(a).split("::")[0]).resolve() for a in config.args}
    ignored = {pathlib.Path(str(path)).resolve() for path in config.getoption("ignore") or ()}
    if all(
        (_TESTS in asked or _TESTS / folder in asked) and _TESTS / folder not in ignored
        for folder in ("integration", "e2e")
    ):
        missing = sorted(_QUICK_NAMES.difference(*(_names(item) for item in items)))
        if missing:
            raise pytest.UsageError(f"tests/conftest.py QUICK names tests that do not exist: {missing}")
