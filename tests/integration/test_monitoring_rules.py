"""The monitoring component's alerts: `promtool check rules` and `promtool test rules` (Prometheus
built from Go modules) with a unit test of every alert, firing and quiet; and every coroner_* series
the alerts, their unit tests and the dashboard use is one a real operator exports (scraped from its
/metrics after a real retirement), with the labels it really carries."""

from __future__ import annotations

import json
import pathlib
import re
import shutil
import socket
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from prometheus_client.parser import text_string_to_metric_families

from coroner.client.kube import api_client
from coroner.core import api
from coroner_dev.devcluster.cluster import Cluster
from support import components, helm, kube

pytestmark = pytest.mark.integration

MONITORING = kube.MANIFESTS / "components" / "monitoring"
UNIT_TESTS = pathlib.Path(__file__).resolve().parents[1] / "monitoring" / "prometheusrule.test.yaml"
BOOT = "8d0a4c6e-3b1f-4c1e-9a56-0d6f0c1b2a3e"
HOST = "0f2e7a1c9d8b4e6f8a7b6c5d4e3f2a1b"
#: Series from outside the operator the alerts rely on, with the labels they use: kube-state-metrics'
#: default `leases` and `nodes` collectors, and Prometheus' own `up`.
EXTERNAL = {
    "kube_lease_renew_time": {"namespace", "lease"},
    "kube_node_status_condition": {"node", "condition", "status"},
    "up": {"job"},
}
#: Labels Prometheus adds at scrape time (jobLabel, the pod's namespace and name).
TARGET_LABELS = {"job", "namespace", "pod", "instance"}
SERIES = re.compile(r"\b(coroner_[a-z_]+)\b(\{[^}]*\})?")
MATCHER = re.compile(r'(\w+)\s*(?:=~|!~|!=|=)\s*"')
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")


def rule_groups() -> list[dict[str, Any]]:
    (rule,) = [doc for doc in yaml.safe_load_all((MONITORING / "prometheusrule.yaml").read_text()) if doc]
    return list(rule["spec"]["groups"])


def alerts() -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for group in rule_groups() for r in group["rules"] if "alert" in r}


def dashboard_expressions() -> list[str]:
    dashboard = json.loads((MONITORING / "coroner-dashboard.json").read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]


@pytest.fixture
def rules_dir(tmp_path: pathlib.Path) -> pathlib.Path:
    (tmp_path / "prometheusrule.rules.yaml").write_text(yaml.safe_dump({"groups": rule_groups()}, sort_keys=False))
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    return tmp_path


def test_promtool_checks_the_rules(rules_dir: pathlib.Path) -> None:
    checked = helm.run("promtool", "check", "rules", str(rules_dir / "prometheusrule.rules.yaml"))
    assert f"SUCCESS: {len(alerts())} rules found" in checked.stdout + checked.stderr


def test_promtool_unit_tests_pass_and_cover_every_alert_firing_and_quiet(rules_dir: pathlib.Path) -> None:
    tested = helm.run("promtool", "test", "rules", str(rules_dir / UNIT_TESTS.name), check=False)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    cases = [case for test in yaml.safe_load(UNIT_TESTS.read_text())["tests"] for case in test["alert_rule_test"]]
    firing = {case["alertname"] for case in cases if case["exp_alerts"]}
    quiet = {case["alertname"] for case in cases if not case["exp_alerts"]}
    assert firing == set(alerts()) and quiet == set(alerts())


@pytest.fixture(scope="module")
def exported(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str]]:
    """Sample name -> label names, scraped from a real operator's /metrics after one real retirement
    (so the labelled families have samples); families without samples contribute their names."""
    components.install(cluster, grant=True)
    namespace = f"t-metrics-{tmp_path_factory.mktemp('m').name[-6:]}".lower().replace("_", "-")
    with api_client(cluster.kubeconfig) as admin:
        k8s.CoreV1Api(admin).create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace)))
        try:
            return _scrape_after_a_retirement(cluster, admin, namespace, tmp_path_factory.mktemp("operator"))
        finally:
            k8s.CoreV1Api(admin).delete_namespace(namespace)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _scrape_after_a_retirement(
    cluster: Cluster, admin: k8s.ApiClient, namespace: str, logs: pathlib.Path
) -> dict[str, set[str]]:
    port = _free_port()
    argv = components.operator_argv(
        components.operator_kubeconfig(cluster), f"--metrics-port={port}", "--metrics-bind-address=127.0.0.1"
    )
    components.put_agent_lease(admin, node="node-a", boot_id=BOOT, host_id=HOST)
    with components.process(argv, log=logs / "operator.log"):
        kube.create_registration(admin, namespace, kube.registration_body(name="dies", pid=300, interval=None))
        kube.create_registration(admin, namespace, kube.registration_body(name="waits", pid=301, interval=None))
        with api_client(components.agent_kubeconfig(cluster, "node-a")) as agent:
            components.attest(agent, namespace, "dies", evidence="PidfdExited")
        kube.wait_for(lambda: components.retired(admin, namespace, "dies"), timeout=120, what="a real retirement")

        def scrape() -> str | None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
                    text = answer.read().decode()
            except OSError:
                return None
            # Wait until the sweep has counted the objects, and the retirement is observed.
            return text if "coroner_registration_objects{" in text and "coroner_retirements_total{" in text else None

        text = kube.wait_for(scrape, timeout=120, what="the operator's /metrics with the retirement counted")
    found: dict[str, set[str]] = {}
    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created")}
    for family in text_string_to_metric_families(text):
        for suffix in suffixes.get(family.type, ("",)):
            found.setdefault(family.name + suffix, set())
        for sample in family.samples:
            found.setdefault(sample.name, set()).update(sample.labels)
    return found


def _selectors(expression: str) -> Iterator[tuple[str, set[str]]]:
    """(coroner_* series, label names it is matched or grouped by) in one expression."""
    grouped = {label.strip() for found in GROUPING.findall(expression) for label in found.split(",") if label.strip()}
    for name, braces in SERIES.findall(expression):
        yield name, set(MATCHER.findall(braces or "")) | grouped


def test_every_series_the_alerts_and_the_dashboard_use_is_exported(exported: dict[str, set[str]]) -> None:
    assert "coroner_retirements_total" in exported and "evidence" in exported["coroner_retirements_total"]
    expressions = [rule["expr"] for rule in alerts().values()] + dashboard_expressions()
    used = set()
    for expression in expressions:
        for name, labels in _selectors(expression):
            used.add(name)
            assert name in exported, f"{name} (in {expression!r}) is not exported by the operator"
            labelled = exported[name]
            if labelled:  # a family with samples: its labels are known
                unknown = labels - labelled - {"le"} - TARGET_LABELS - set().union(*EXTERNAL.values())
                assert not unknown, f"{name} has no label(s) {unknown} (it has {sorted(labelled)}): {expression!r}"
    assert {
        "coroner_registrations",
        "coroner_retire_abandoned_total",
        "coroner_death_to_retirement_seconds_bucket",
    } <= used
    for expression in (rule["expr"] for rule in alerts().values()):
        others = set(re.findall(r"\b(kube_[a-z_]+|up)\b(?=\s*\{)", expression))
        assert others <= set(EXTERNAL), f"{others - set(EXTERNAL)} is neither the operator's nor listed in EXTERNAL"


def test_the_unit_tests_feed_series_with_the_exported_names_and_labels(exported: dict[str, set[str]]) -> None:
    for test in yaml.safe_load(UNIT_TESTS.read_text())["tests"]:
        for series in test["input_series"]:
            name, _, labels = series["series"].partition("{")
            keys = set(MATCHER.findall("{" + labels))
            if name.startswith("coroner_"):
                assert name in exported, f"unit test series {name} is not exported by the operator"
                if exported[name]:
                    assert keys - TARGET_LABELS - {"le"} <= exported[name], (name, keys, exported[name])
            else:
                assert name in EXTERNAL and EXTERNAL[name] <= keys | TARGET_LABELS, series["series"]


def _counted(port: int, name: str) -> float | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            text = answer.read().decode()
    except OSError:
        return None
    samples = [s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]
    return samples[0] if samples else None


def test_the_operator_counts_each_delete_of_an_active_registration_and_no_other(
    cluster: Cluster, tmp_path: pathlib.Path
) -> None:
    """What a cluster admin can still do (policy coroner-delete-only-terminal exempts system:masters)
    is flagged: coroner_active_registration_deletions_total, which CoronerActiveRegistrationDeleted
    alerts on. A terminal registration deleted (what retention does) is not counted."""
    components.install(cluster, grant=False)
    port = _free_port()
    argv = components.operator_argv(
        components.operator_kubeconfig(cluster), f"--metrics-port={port}", "--metrics-bind-address=127.0.0.1"
    )
    name = "coroner_active_registration_deletions_total"
    # Released now: well inside its retention, so the operator's own deletion of due terminal
    # registrations leaves it to the admin's delete below.
    released = {"type": "Released", "status": "True", "reason": "CleanExit", "message": "bye",
                "lastTransitionTime": components.now_text()}  # fmt: skip
    with api_client(cluster.kubeconfig) as admin:
        namespace = f"t-deletes-{tmp_path.name[-6:]}".lower().replace("_", "-")
        k8s.CoreV1Api(admin).create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace)))
        try:
            components.put_agent_lease(admin, node="node-a", boot_id=BOOT, host_id=HOST)
            # Both before the operator starts: `done` is Released before the operator could write its
            # conditions (an admin replacing them then is refused), and its first list sees both.
            kube.create_registration(admin, namespace, kube.registration_body(name="done", interval=None))
            kube.patch_status(admin, namespace, "done", {"status": {"conditions": [released], "state": "Released"}})
            kube.create_registration(admin, namespace, kube.registration_body(name="live", interval=None))
            with components.process(argv, log=tmp_path / "operator.log"):
                assert kube.wait_for(lambda: _counted(port, name) == 0.0, timeout=120, what="the operator's /metrics")
                # Only a registration the operator has seen can have its deletion counted, and /metrics
                # answers before its watch has started on a loaded machine: its decision on `live` says
                # it has listed both.
                kube.wait_for(
                    lambda: components.reason(admin, namespace, "live"), timeout=120, what="the operator's decision"
                )
                kube.custom(admin).delete_namespaced_custom_object(
                    api.GROUP, api.VERSION, namespace, api.PLURAL, "done"
                )
                kube.custom(admin).delete_namespaced_custom_object(
                    api.GROUP, api.VERSION, namespace, api.PLURAL, "live"
                )
                kube.wait_for(lambda: _counted(port, name) == 1.0, timeout=60, what="the active delete counted")
                line = f"active registration deleted namespace={namespace} name=live registered-by=admin"
                log = (tmp_path / "operator.log").read_text()
                assert line in log, log[-3000:]
        finally:
            k8s.CoreV1Api(admin).delete_namespace(namespace)
