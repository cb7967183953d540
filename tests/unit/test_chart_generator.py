"""The pure parts of the chart generator (coroner_dev.chart): how one kustomize object becomes a
template, table-driven, and the brace escaping, by property. The whole chart against kustomize,
with the real tools, is tests/integration/test_chart.py."""

from __future__ import annotations

import pathlib
import re
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from coroner_dev import chart

pytestmark = pytest.mark.unit

VALUES: dict[str, Any] = yaml.safe_load((chart.CHART / "values.yaml").read_text())
CHART_META: dict[str, Any] = yaml.safe_load((chart.CHART / "Chart.yaml").read_text())


#: A string action of braces, as the generator writes them; Helm renders it as the string.
_ESCAPE = re.compile(r'\{\{ "([{}]+)" \}\}')


@given(st.text(alphabet=st.sampled_from(list("{} a$.|x\n")), max_size=60))
def test_escaped_braces_render_back_to_the_original(text: str) -> None:
    escaped = chart._escape_braces(text)
    assert _ESCAPE.sub(lambda m: m.group(1), escaped) == text
    _assert_only_escapes_are_actions(escaped)


def _assert_only_escapes_are_actions(escaped: str) -> None:
    """Go's template lexer takes the first `{{` it meets as an action: none may start outside the
    escapes, not even with one literal brace right before an escape's `{{`."""
    literal = _ESCAPE.sub("\0", escaped)
    assert "{{" not in literal and "}}" not in literal and "{\0" not in literal, escaped


@pytest.mark.parametrize("text", ["{}}{", "{{{", "a }}} b", "{{ $labels.node }}"])
def test_brace_runs_that_once_broke_the_escape(text: str) -> None:
    escaped = chart._escape_braces(text)
    assert _ESCAPE.sub(lambda m: m.group(1), escaped) == text
    _assert_only_escapes_are_actions(escaped)


@pytest.mark.parametrize(
    ("assignment", "also", "expected"),
    [
        ({}, (), ""),
        ({"retireGrant": True}, (), ".Values.retireGrant.enabled"),
        ({"nodeLoss": False}, (), "(not .Values.nodeLoss.enabled)"),
        ({"nodeLoss": True, "monitoring": False}, (), "and .Values.nodeLoss.enabled (not .Values.monitoring.enabled)"),
        ({}, (".Values.namespace.create",), ".Values.namespace.create"),
        ({"a": True}, (".Values.namespace.create",), "and .Values.namespace.create .Values.a.enabled"),
    ],
)
def test_conditions(assignment: dict[str, bool], also: tuple[str, ...], expected: str) -> None:
    assert chart._condition(assignment, also=also) == expected


def test_every_component_directory_is_a_values_key(tmp_path: pathlib.Path) -> None:
    for name in ("retire-grant", "node-loss", "monitoring", "agent-apparmor", "empty-dir"):
        (tmp_path / "components" / name).mkdir(parents=True)
        if name != "empty-dir":
            (tmp_path / "components" / name / "kustomization.yaml").write_text("kind: Component\n")
    assert chart.components(tmp_path) == {
        "agentAppArmor": "agent-apparmor",
        "monitoring": "monitoring",
        "nodeLoss": "node-loss",
        "retireGrant": "retire-grant",
    }
    assert len(chart.combinations(tmp_path)) == 16


SA = {
    "apiVersion": "v1",
    "kind": "ServiceAccount",
    "metadata": {"name": "coroner-agent", "namespace": "coroner-system"},
}
BINDING = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "ClusterRoleBinding",
    "metadata": {"name": "coroner-agent"},
    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "coroner-agent"},
    "subjects": [{"kind": "ServiceAccount", "name": "coroner-agent", "namespace": "coroner-system"}],
}
POLICY = {
    "apiVersion": "admissionregistration.k8s.io/v1",
    "kind": "ValidatingAdmissionPolicy",
    "metadata": {"name": "coroner-system-leases-by-owner"},
    "spec": {
        "matchConditions": [
            {
                "name": "is-agent",
                "expression": "request.userInfo.username == 'system:serviceaccount:coroner-system:coroner-agent'",
            }
        ],
        "validations": [{"expression": "request.name.startsWith('coroner-agent-')", "message": "{{ not a template }}"}],
    },
}
NAMESPACE = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "coroner-system"}}


@pytest.mark.parametrize(
    ("obj", "present", "absent"),
    [
        pytest.param(
            SA,
            ["name: {{ .Values.namePrefix }}coroner-agent", "namespace: {{ .Release.Namespace }}"],
            ["coroner-system"],
            id="serviceaccount-prefixed-and-namespaced",
        ),
        pytest.param(
            BINDING,
            [
                "  name: {{ .Values.namePrefix }}coroner-agent\n",
                "- kind: ServiceAccount\n  name: {{ .Values.namePrefix }}",
            ],
            ["coroner-system"],
            id="binding-references-follow",
        ),
        pytest.param(
            POLICY,
            [
                "name: coroner-system-leases-by-owner",  # a policy's name stays (doctor finds it)
                "system:serviceaccount:{{ .Release.Namespace }}:{{ .Values.namePrefix }}coroner-agent",
                "startsWith('coroner-agent-')",  # the agent Lease prefix is not a name to prefix
                '{{ "{{" }} not a template {{ "}}" }}',
            ],
            ["serviceaccount:coroner-system"],
            id="policy-identities-follow-names-stay",
        ),
        pytest.param(
            NAMESPACE,
            ["name: {{ .Release.Namespace }}", "helm.sh/resource-policy: keep"],
            ["coroner-system"],
            id="namespace-is-the-release-and-kept",
        ),
    ],
)
def test_one_object_as_a_template(obj: dict[str, Any], present: list[str], absent: list[str]) -> None:
    text = chart._templated(obj, VALUES, CHART_META)
    for needle in present:
        assert needle in text
    for needle in absent:
        assert needle not in text
    assert "app.kubernetes.io/managed-by: Helm" in text and "__" not in text


def _workload(image: str, resources: dict[str, Any], args: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "coroner-operator", "namespace": "coroner-system"},
        "spec": {
            "template": {
                "metadata": {"labels": {"app.kubernetes.io/name": "coroner-operator"}},
                "spec": {
                    # The pod-level values' defaults, as the manifests have them.
                    **{field: VALUES["operator"][field] for field in chart.POD_FIELDS if VALUES["operator"][field]},
                    "serviceAccountName": "coroner-operator",
                    "containers": [{"name": "operator", "image": image, "args": args, "resources": resources}],
                    "volumes": [
                        {"name": "v", "configMap": {"name": "coroner-dashboard"}},
                        {"name": "w", "configMap": {"name": "theirs"}},
                    ],
                },
            }
        },
    }


def test_a_workload_takes_image_resources_arguments_and_namespace_from_values() -> None:
    operator = VALUES["operator"]
    obj = _workload(
        f"{operator['image']['repository']}:{CHART_META['appVersion']}",
        operator["resources"],
        ["--all-namespaces", f"--terminal-retention-seconds={operator['terminalRetentionSeconds']}"],
    )
    text = chart._templated(obj, VALUES, CHART_META, frozenset({"coroner-dashboard"}))
    assert 'image: {{ include "coroner.image" (list .Values.operator.image .Chart) }}' in text
    assert "{{- toYaml .Values.operator.resources | nindent 10 }}" in text
    assert "--terminal-retention-seconds={{ int64 .Values.operator.terminalRetentionSeconds }}" in text
    assert '{{- if ne .Release.Namespace "coroner-system" }}\n        - --system-namespace=' in text
    assert "name: {{ .Values.namePrefix }}coroner-dashboard" in text and "name: theirs" in text


@pytest.mark.parametrize(
    ("image", "resources", "args", "complaint"),
    [
        ("elsewhere/operator:v9", None, [], "image"),
        (None, {"requests": {"cpu": "1"}}, [], "resources"),
        (None, None, ["--terminal-retention-seconds=5"], "terminalRetentionSeconds"),
    ],
)
def test_a_manifest_that_drifted_from_values_is_refused(
    image: str | None, resources: dict[str, Any] | None, args: list[str], complaint: str
) -> None:
    operator = VALUES["operator"]
    obj = _workload(
        image or f"{operator['image']['repository']}:{CHART_META['appVersion']}",
        resources or operator["resources"],
        args,
    )
    with pytest.raises(ValueError, match=complaint):
        chart._templated(obj, VALUES, CHART_META)


def test_an_init_container_of_a_coroner_image_follows_the_values_image_too() -> None:
    """The agent's seccomp installer runs the agent image: a release pinned by digest, or pulled from
    another registry, must not leave it on the default reference."""
    agent = VALUES["agent"]
    default = f"{agent['image']['repository']}:{CHART_META['appVersion']}"
    obj = _workload(default, VALUES["operator"]["resources"], [])
    obj["spec"]["template"]["spec"]["containers"][0]["image"] = (
        f"{VALUES['operator']['image']['repository']}:{CHART_META['appVersion']}"
    )
    obj["spec"]["template"]["spec"]["initContainers"] = [{"name": "install-seccomp-profile", "image": default}]
    text = chart._templated(obj, VALUES, CHART_META)
    assert default not in text
    assert text.count('{{ include "coroner.image" (list .Values.agent.image .Chart) }}') == 1


def _default_operator() -> dict[str, Any]:
    operator = VALUES["operator"]
    return _workload(
        f"{operator['image']['repository']}:{CHART_META['appVersion']}",
        operator["resources"],
        [f"--terminal-retention-seconds={operator['terminalRetentionSeconds']}"],
    )


def test_a_workload_takes_its_pod_level_values_each_left_out_while_empty() -> None:
    text = chart._templated(_default_operator(), VALUES, CHART_META)
    for field in chart.POD_FIELDS:
        assert f"{{{{- with .Values.operator.{field} }}}}\n" in text, field
    assert "      priorityClassName: {{ . | quote }}\n" in text
    assert "      affinity:\n{{- toYaml . | nindent 8 }}\n" in text
    assert "{{- range .Values.operator.extraArgs }}\n        - {{ . | quote }}\n{{- end }}\n" in text
    # The manifests' own Pod labels stay literal; extra ones follow and may not replace them.
    assert (
        "        app.kubernetes.io/name: coroner-operator\n{{- with .Values.operator.podLabels }}\n"
        '{{- include "coroner.extend" (list . (list "app.kubernetes.io/name") "operator.podLabels") | nindent 8 }}'
    ) in text
    assert "{{- with .Values.operator.podAnnotations }}\n      annotations:\n" in text
    assert "__" not in text


def test_a_pod_level_default_that_drifted_from_the_manifests_is_refused() -> None:
    obj = _default_operator()
    obj["spec"]["template"]["spec"]["tolerations"] = [{"operator": "Exists"}]
    with pytest.raises(ValueError, match=r"operator\.tolerations"):
        chart._templated(obj, VALUES, CHART_META)


def test_monitoring_objects_take_monitoring_labels_after_their_own() -> None:
    monitor = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {
            "name": "coroner-agent",
            "namespace": "coroner-system",
            "labels": {"app.kubernetes.io/part-of": "coroner"},
        },
        "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": "coroner-agent"}}},
    }
    text = chart._templated(monitor, VALUES, CHART_META)
    own = " ".join(f'"{label}"' for label in ("app.kubernetes.io/part-of", *chart.HELM_LABELS))
    assert f'{{{{- include "coroner.extend" (list . (list {own}) "monitoring.labels") | nindent 4 }}}}' in text
    assert "monitoring.labels" not in chart._templated(SA, VALUES, CHART_META)
