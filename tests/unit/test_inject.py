"""coroner.core.inject: the registrar injected into every kind with a Pod template, the same way
twice (idempotence as a property), List items one by one, everything else untouched, and the Pods
it cannot work in refused with the object named and the fix. The admission policy's twin is held
equal on the real API server by tests/integration/test_registrar_injection.py; here only what can
drift without a server: the policy's literals and the registrar command's environment."""

from __future__ import annotations

import copy
import pathlib
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import coroner
from coroner.cli import main as cli_main
from coroner.core import inject

pytestmark = pytest.mark.unit

ROOT = pathlib.Path(__file__).resolve().parents[2]
COMPONENT = ROOT / "manifests" / "components" / "registrar-injection"


def pod_spec(**extra: Any) -> dict[str, Any]:
    return {"containers": [{"name": "app", "image": "registry.example/app:1"}], **extra}


def template(**extra: Any) -> dict[str, Any]:
    return {"metadata": {"labels": {"app": "w"}}, "spec": pod_spec(**extra)}


def workload(kind: str, **extra: Any) -> dict[str, Any]:
    """A minimal object of `kind` whose Pod spec has `extra`."""
    meta = {"name": "w", "namespace": "jobs"}
    if kind == "Pod":
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod_spec(**extra)}
    if kind == "CronJob":
        job = {"template": template(restartPolicy="Never", **extra)}
        spec = {"schedule": "*/5 * * * *", "jobTemplate": {"spec": job}}
        return {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": meta, "spec": spec}
    group = "batch/v1" if kind == "Job" else "apps/v1"
    return {"apiVersion": group, "kind": kind, "metadata": meta, "spec": {"template": template(**extra)}}


#: kind -> where its Pod template is (the object itself for a Pod).
KINDS: dict[str, tuple[str, ...]] = {
    "Pod": (),
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}


def at(obj: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    for key in path:
        obj = obj[key]
    return obj


def test_the_table_is_the_modules() -> None:
    assert {kind: path for (_, kind), path in inject.TEMPLATES.items()} == KINDS


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_kind_with_a_pod_template_gets_exactly_the_registrar(kind: str) -> None:
    before = workload(kind)
    after = inject.inject(before)
    tmpl = at(after, KINDS[kind])
    spec = tmpl["spec"]
    assert spec["shareProcessNamespace"] is True
    assert spec["initContainers"] == [inject.container()]
    assert spec["volumes"] == [inject.token_volume()]
    assert spec["containers"] == at(before, KINDS[kind])["spec"]["containers"]
    assert tmpl["metadata"]["annotations"] == {inject.INJECTED_ANNOTATION: inject.INJECTION_VERSION}
    # Nothing outside the Pod template changed, and the argument was not touched.
    assert before == workload(kind)
    outside = copy.deepcopy(after)
    at(outside, KINDS[kind]).clear()
    stripped = copy.deepcopy(before)
    at(stripped, KINDS[kind]).clear()
    assert outside == stripped


def test_the_registrar_container_as_specified() -> None:
    registrar = inject.container()
    assert registrar["name"] == "coroner-registrar"
    assert registrar["image"] == "ghcr.io/coroner-dev/coroner-registrar:v0.1.0"
    assert registrar["args"] == ["registrar"]
    assert registrar["restartPolicy"] == "Always"
    assert {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in registrar["env"]} == {
        "NODE_NAME": "spec.nodeName",
        "POD_NAME": "metadata.name",
        "POD_NAMESPACE": "metadata.namespace",
    }
    assert registrar["resources"] == {"requests": {"cpu": "5m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}}
    assert registrar["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert registrar["volumeMounts"] == [
        {
            "name": "coroner-registrar-token",
            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
            "readOnly": True,
        }
    ]
    sources = inject.token_volume()["projected"]["sources"]
    assert [next(iter(source)) for source in sources] == ["serviceAccountToken", "configMap", "downwardAPI"]
    assert inject.token_volume()["projected"]["defaultMode"] == 0o644  # the token readable by uid 65532


def test_the_registrar_reads_the_environment_injected() -> None:
    """The downward-API variables are the ones `coroner registrar` takes its options from."""
    command = cli_main.main.commands["registrar"]
    envvars = {p.name: p.envvar for p in command.params if getattr(p, "envvar", None)}
    assert envvars == {"namespace": "POD_NAMESPACE", "node_name": "NODE_NAME", "pod_name": "POD_NAME"}
    assert {name for name, _ in inject.ENV} == set(envvars.values())


def test_the_version_is_the_packages() -> None:
    assert f"v{coroner.__version__}" == inject.INJECTION_VERSION
    assert inject.REGISTRAR_IMAGE.endswith(f":{inject.INJECTION_VERSION}")


def test_the_image_can_be_overridden() -> None:
    after = inject.inject(workload("Deployment"), image="registry.example/mirror/coroner-registrar@sha256:" + "a" * 64)
    assert after["spec"]["template"]["spec"]["initContainers"][0]["image"].startswith("registry.example/mirror/")


def test_what_the_pod_had_is_kept_in_its_order_after_the_registrar() -> None:
    spec = pod_spec(
        initContainers=[{"name": "migrate", "image": "m"}, {"name": "proxy", "image": "p", "restartPolicy": "Always"}],
        volumes=[{"name": "data", "emptyDir": {}}],
        automountServiceAccountToken=False,
        shareProcessNamespace=True,
    )
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "annotations": {"a": "b"}}, "spec": spec}
    after = inject.inject(pod)
    assert [c["name"] for c in after["spec"]["initContainers"]] == ["coroner-registrar", "migrate", "proxy"]
    assert [v["name"] for v in after["spec"]["volumes"]] == ["data", "coroner-registrar-token"]
    # automount off: the registrar still has its token (its own projected volume), the others none.
    assert after["spec"]["automountServiceAccountToken"] is False
    assert after["metadata"]["annotations"] == {"a": "b", "coroner.dev/injected": "v0.1.0"}


def test_an_older_injection_is_replaced_not_duplicated() -> None:
    older = inject.container("ghcr.io/coroner-dev/coroner-registrar:v0.0.9")
    older["args"] = ["registrar", "--scan-seconds=1"]
    volume = {"name": "coroner-registrar-token", "secret": {"secretName": "old"}}
    spec = pod_spec(
        initContainers=[{"name": "migrate", "image": "m"}, older], volumes=[volume, {"name": "d", "emptyDir": {}}]
    )
    after = inject.inject(workload("Deployment", **spec))
    got = after["spec"]["template"]["spec"]
    assert got["initContainers"] == [inject.container(), {"name": "migrate", "image": "m"}]
    assert got["volumes"] == [{"name": "d", "emptyDir": {}}, inject.token_volume()]


def test_other_kinds_pass_through_unchanged() -> None:
    others = [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}, "spec": {"ports": [{"port": 80}]}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"spec": "template"}},
        # A kind of the same name in another group is not Kubernetes' own: its template may mean anything.
        {
            "apiVersion": "example.com/v1",
            "kind": "Deployment",
            "metadata": {"name": "x"},
            "spec": {"template": template()},
        },
        {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": template()},
        {"kind": "Unknown"},
        {},
    ]
    for other in others:
        result = inject.inject_reporting(other)
        assert result.document == other and result.injected == ()


def test_a_list_is_injected_item_by_item_and_keeps_its_order() -> None:
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}}
    items = [
        workload("Deployment"),
        service,
        workload("CronJob"),
        {"apiVersion": "v1", "kind": "List", "items": [workload("Pod")]},
    ]
    listed = {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": items}
    result = inject.inject_reporting(listed)
    assert result.document["items"][0] == inject.inject(items[0])
    assert result.document["items"][1] == service
    assert result.document["items"][2] == inject.inject(items[2])
    assert result.document["items"][3]["items"] == [inject.inject(workload("Pod"))]
    assert result.injected == (
        "Deployment jobs/w (List item 0)",
        "CronJob jobs/w (List item 2)",
        "Pod jobs/w (List item 3, List item 0)",
    )
    assert inject.inject(result.document) == result.document


def test_a_typed_lists_items_are_of_its_kind() -> None:
    """As the API returns a DeploymentList: items without kind or apiVersion, and they stay so."""
    item = {key: value for key, value in workload("Deployment").items() if key not in ("apiVersion", "kind")}
    listed = {"apiVersion": "apps/v1", "kind": "DeploymentList", "items": [item]}
    result = inject.inject_reporting(listed)
    (got,) = result.document["items"]
    assert "kind" not in got and "apiVersion" not in got
    assert got["spec"]["template"]["spec"]["initContainers"] == [inject.container()]
    assert result.injected == ("Deployment jobs/w (DeploymentList item 0)",)


REFUSALS = [
    pytest.param({"hostPID": True}, "sets hostPID: true", "remove hostPID", id="hostPID"),
    pytest.param({"shareProcessNamespace": False}, "shareProcessNamespace: false", "remove the field", id="no-sharing"),
    pytest.param({"os": {"name": "windows"}}, "Windows", "leave it out", id="windows"),
    pytest.param(
        {"containers": [{"name": "coroner-registrar", "image": "x"}]},
        "already has a container named coroner-registrar in containers",
        "rename that container",
        id="name-taken",
    ),
    pytest.param(
        {"ephemeralContainers": [{"name": "coroner-registrar", "image": "x"}]},
        "in ephemeralContainers",
        "rename that container",
        id="name-taken-ephemeral",
    ),
    pytest.param({"containers": "app"}, "containers is not a list of objects", "fix the manifest", id="malformed"),
    pytest.param({"volumes": [7]}, "volumes is not a list of objects", "fix the manifest", id="malformed-volumes"),
]


@pytest.mark.parametrize(("extra", "why", "fix"), REFUSALS)
@pytest.mark.parametrize("kind", list(KINDS))
def test_pods_the_registrar_cannot_work_in_are_refused_naming_the_object_and_the_fix(
    kind: str, extra: dict[str, Any], why: str, fix: str
) -> None:
    with pytest.raises(inject.InjectionRefused) as refused:
        inject.inject(workload(kind, **extra))
    message = str(refused.value)
    where = ".".join((*KINDS[kind], "spec"))
    assert message.startswith(f"cannot inject the registrar into {kind} jobs/w: {where}")
    assert why in message and fix in message
    assert refused.value.what == f"{kind} jobs/w"


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (
            {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}},
            "no Pod template at spec.template \\(spec is missing",
        ),
        (
            {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}, "spec": {"template": {}}},
            "spec.template.spec",
        ),
        (
            {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "c"}, "spec": {"jobTemplate": 3}},
            r"no Pod template at spec.jobTemplate.spec.template \(spec.jobTemplate is",
        ),
        ({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}, "Pod p: spec is missing"),
        (
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "annotations": []}, "spec": pod_spec()},
            "annotations",
        ),
    ],
)
def test_a_workload_without_a_pod_template_is_refused(obj: dict[str, Any], message: str) -> None:
    with pytest.raises(inject.InjectionRefused, match=message):
        inject.inject(obj)


def test_a_refused_list_item_is_named_by_its_place() -> None:
    listed = {"apiVersion": "v1", "kind": "List", "items": [workload("Pod"), workload("Job", hostPID=True)]}
    with pytest.raises(
        inject.InjectionRefused, match=r"into Job jobs/w \(List item 1\): spec.template.spec sets hostPID"
    ):
        inject.inject(listed)


# --- properties ----------------------------------------------------------------------------------------

names = st.sampled_from(["app", "sidecar", "migrate", "coroner-registrar", "data", "coroner-registrar-token"])
containers = st.lists(st.fixed_dictionaries({"name": names, "image": st.sampled_from(["a:1", "b:2"])}), max_size=3)
volumes = st.lists(st.fixed_dictionaries({"name": names, "emptyDir": st.just({})}), max_size=3)
specs = st.fixed_dictionaries(
    {"containers": containers.filter(lambda cs: all(c["name"] != "coroner-registrar" for c in cs))},
    optional={
        "initContainers": containers,
        "volumes": volumes,
        "shareProcessNamespace": st.just(True),
        "automountServiceAccountToken": st.booleans(),
        "hostPID": st.just(False),
        "serviceAccountName": st.sampled_from(["default", "worker"]),
    },
)
annotations = st.none() | st.dictionaries(
    st.sampled_from(["a", "coroner.dev/injected"]), st.text(max_size=3), max_size=2
)


@st.composite
def workloads(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(list(KINDS)))
    obj = workload(kind)
    tmpl = at(obj, KINDS[kind])
    tmpl["spec"] = draw(specs)
    notes = draw(annotations)
    if notes is not None:
        tmpl.setdefault("metadata", {})["annotations"] = notes
    return obj


manifests = workloads() | st.builds(
    lambda items: {"apiVersion": "v1", "kind": "List", "items": items},
    st.lists(workloads() | st.just({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}}), max_size=3),
)


@settings(max_examples=300, deadline=None)
@given(manifest=manifests, image=st.sampled_from([inject.REGISTRAR_IMAGE, "mirror.example/r:1"]))
def test_injecting_twice_is_injecting_once(manifest: dict[str, Any], image: str) -> None:
    before = copy.deepcopy(manifest)
    once = inject.inject(manifest, image=image)
    assert manifest == before  # the argument is never changed
    assert inject.inject(once, image=image) == once
    # Only the newest image survives a re-injection with another.
    assert inject.inject(once) == inject.inject(manifest)


@settings(max_examples=300, deadline=None)
@given(manifest=workloads())
def test_exactly_one_registrar_and_everything_else_kept(manifest: dict[str, Any]) -> None:
    kind = manifest["kind"]
    before = at(manifest, KINDS[kind])["spec"]
    spec = at(inject.inject(manifest), KINDS[kind])["spec"]
    inits = spec["initContainers"]
    assert inits[0] == inject.container()
    assert [c for c in inits[1:]] == [c for c in before.get("initContainers", []) if c["name"] != "coroner-registrar"]
    assert spec["containers"] == before["containers"]
    assert [v["name"] for v in spec["volumes"]].count("coroner-registrar-token") == 1
    assert spec["volumes"][-1] == inject.token_volume()
    assert spec["shareProcessNamespace"] is True
    assert {k: v for k, v in spec.items() if k not in ("initContainers", "volumes", "shareProcessNamespace")} == {
        k: v for k, v in before.items() if k not in ("initContainers", "volumes", "shareProcessNamespace")
    }


# --- the admission policy: the literals that would drift without a server --------------------------------


def component_documents() -> dict[tuple[str, str], dict[str, Any]]:
    text = (COMPONENT / "registrar-injection.yaml").read_text()
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(text) if d}


def test_the_admission_policy_injects_this_release_for_labelled_pods_only() -> None:
    documents = component_documents()
    policy = documents[("MutatingAdmissionPolicy", "coroner-registrar-injection")]
    (mutation,) = policy["spec"]["mutations"]
    expression = mutation["jsonPatch"]["expression"]
    assert f'image: "{inject.REGISTRAR_IMAGE}"' in expression
    assert f'value: "{inject.INJECTION_VERSION}"' in expression
    assert f'jsonpatch.escapeKey("{inject.INJECTED_ANNOTATION}")' in expression
    for literal in (inject.CONTAINER_NAME, inject.TOKEN_VOLUME, inject.SERVICE_ACCOUNT_PATH, "3607", "420"):
        assert literal in expression
    for value in (*inject.RESOURCES["requests"].values(), *inject.RESOURCES["limits"].values()):
        assert f'"{value}"' in expression
    constraints = policy["spec"]["matchConstraints"]
    assert constraints["objectSelector"] == {"matchLabels": {inject.INJECT_LABEL: "true"}}
    assert constraints["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
    ]
    assert policy["spec"]["failurePolicy"] == "Fail"
    binding = documents[("MutatingAdmissionPolicyBinding", "coroner-registrar-injection")]
    assert binding["spec"]["policyName"] == "coroner-registrar-injection"
    refusals = documents[("ValidatingAdmissionPolicy", "coroner-registrar-injectable")]
    assert refusals["spec"]["matchConstraints"] == constraints
    assert documents[("ValidatingAdmissionPolicyBinding", "coroner-registrar-injectable")]["spec"] == {
        "policyName": "coroner-registrar-injectable",
        "validationActions": ["Deny"],
    }
