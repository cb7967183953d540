"""The registrar's injection into a Pod template: the one place that builds it.

`coroner registrar` (coroner.registrar) registers the main process of every other container of its
Pod, so a worker whose image holds nothing of Coroner (Go in `scratch`, a JVM in distroless) is
registered all the same. It runs as a native sidecar (an init container with `restartPolicy:
Always`) in a Pod with `shareProcessNamespace: true`, under the Pod's ServiceAccount token. This
module adds exactly that to a manifest; `kubectl coroner inject` prints what it returns, and the
MutatingAdmissionPolicy of manifests/components/registrar-injection applies the same mutation to
Pods created with the label `coroner.dev/inject: "true"` (tests/integration/test_registrar_injection.py
holds the two equal on the real API server).

What is injected into the Pod template (`spec.template` of a Deployment, StatefulSet, DaemonSet,
ReplicaSet or Job, `spec.jobTemplate.spec.template` of a CronJob, a Pod itself):

- `shareProcessNamespace: true`: the registrar sees the other containers' processes;
- the init container `coroner-registrar`, first of the init containers (started before any other
  container), `restartPolicy: Always`: the registrar image (`REGISTRAR_IMAGE`, whose entrypoint is
  `coroner`, hence `args: ["registrar"]`), NODE_NAME, POD_NAME and POD_NAMESPACE from the downward
  API, small resources (`RESOURCES`, provisional: not yet measured under load), and no privilege at
  all (`SECURITY_CONTEXT`: uid 65532, no capabilities, read-only root, RuntimeDefault seccomp; what
  it reads and the pidfds it opens need none);
- the Pod's ServiceAccount token as a projected volume (`coroner-registrar-token`, the
  kubelet's automount: a token, `kube-root-ca.crt`'s `ca.crt`, the namespace) mounted only into the
  registrar, at the ServiceAccount path, so it works with `automountServiceAccountToken: false`;
- the annotation `coroner.dev/injected: <INJECTION_VERSION>` on the template's metadata.

Idempotent: an existing `coroner-registrar` init container and `coroner-registrar-token` volume are
replaced by the current ones, never duplicated, so `inject(inject(x)) == inject(x)`. Other kinds
pass through unchanged, a List's items (and a typed list's, such as `kubectl get -o yaml` prints)
are injected one by one. Where the registrar cannot work, `InjectionRefused` names the object, why
and the fix (`refusal`).

Pure: no I/O.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any, Final

import coroner
from coroner.core import api

#: The version of the injection (and of the registrar image it names); recorded on every Pod
#: template it changed, so what was injected by which release can be found.
INJECTION_VERSION: Final = f"v{coroner.__version__}"
#: The registrar's image, pinned as the operator's and the agent's are (their references:
#: manifests/base, coroner_dev.devcluster.imagerecipe); `--image` overrides it. Its entrypoint is
#: `coroner`.
REGISTRAR_IMAGE: Final = f"ghcr.io/coroner-dev/coroner-registrar:{INJECTION_VERSION}"
REGISTRAR_ARGS: Final = ("registrar",)

CONTAINER_NAME: Final = "coroner-registrar"
TOKEN_VOLUME: Final = "coroner-registrar-token"
SERVICE_ACCOUNT_PATH: Final = "/var/run/secrets/kubernetes.io/serviceaccount"
#: As the kubelet's automount asks for it (the API server extends this one expiry, as for automount).
TOKEN_EXPIRATION_SECONDS: Final = 3607
#: On the Pod template: which injection it carries.
INJECTED_ANNOTATION: Final = f"{api.GROUP}/injected"
#: On a Pod: the admission policy of manifests/components/registrar-injection injects it.
INJECT_LABEL: Final = f"{api.GROUP}/inject"

#: Measured on the real node (bench/results/imagefree.json): 28 MiB resident and 2.5 millicores at
#: rest in a Pod of one worker container (a Python process that scans /proc twice a second); not yet
#: measured in a Pod of many containers.
RESOURCES: Final[Mapping[str, Mapping[str, str]]] = {
    "requests": {"cpu": "5m", "memory": "32Mi"},
    "limits": {"memory": "64Mi"},
}
SECURITY_CONTEXT: Final[Mapping[str, Any]] = {
    "runAsNonRoot": True,
    "runAsUser": 65532,
    "runAsGroup": 65532,
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
#: The downward API's fields the registrar reads (coroner.cli.main's `registrar` options).
ENV: Final = (("NODE_NAME", "spec.nodeName"), ("POD_NAME", "metadata.name"), ("POD_NAMESPACE", "metadata.namespace"))

#: (API group, kind) -> the path of its Pod template's metadata-and-spec object; () is the object itself.
TEMPLATES: Final[Mapping[tuple[str, str], tuple[str, ...]]] = {
    ("", "Pod"): (),
    ("apps", "Deployment"): ("spec", "template"),
    ("apps", "StatefulSet"): ("spec", "template"),
    ("apps", "DaemonSet"): ("spec", "template"),
    ("apps", "ReplicaSet"): ("spec", "template"),
    ("batch", "Job"): ("spec", "template"),
    ("batch", "CronJob"): ("spec", "jobTemplate", "spec", "template"),
}


def registration_prefix(*, pod_name: str, container: str) -> str:
    """What the names of the registrations the registrar makes for one container start with (`container`:
    the runtime's id, as the Pod's status and the container's cgroup give it)."""
    return f"{pod_name[:200]}-{container[:12]}-"


def registration_name(*, pod_name: str, container: str, start_time: int) -> str:
    """One name per incarnation: a restarted registrar finds its own registration under it."""
    return f"{registration_prefix(pod_name=pod_name, container=container)}{start_time}"


class InjectionRefused(ValueError):
    """The registrar cannot work in this object's Pods; the message names the object, why and the fix."""

    def __init__(self, what: str, message: str) -> None:
        super().__init__(f"cannot inject the registrar into {what}: {message}")
        self.what = what


@dataclasses.dataclass(frozen=True, slots=True)
class Injection:
    """An object with the registrar injected, and the objects it injected (as `describe` names them)."""

    document: dict[str, Any]
    injected: tuple[str, ...]


def describe(obj: Mapping[str, Any]) -> str:
    """An object as messages name it: `Deployment jobs/web`, `Pod web` (no namespace given)."""
    kind = str(obj.get("kind") or "object")
    metadata = obj.get("metadata")
    metadata = metadata if isinstance(metadata, Mapping) else {}
    name = str(metadata.get("name") or metadata.get("generateName") or "(unnamed)")
    namespace = metadata.get("namespace")
    return f"{kind} {namespace}/{name}" if namespace else f"{kind} {name}"


def container(image: str = REGISTRAR_IMAGE) -> dict[str, Any]:
    """The registrar's init container."""
    return {
        "name": CONTAINER_NAME,
        "image": image,
        "args": list(REGISTRAR_ARGS),
        "restartPolicy": "Always",
        "env": [
            {"name": name, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}} for name, path in ENV
        ],
        "resources": copy.deepcopy({key: dict(value) for key, value in RESOURCES.items()}),
        "securityContext": copy.deepcopy(dict(SECURITY_CONTEXT)),
        "volumeMounts": [{"name": TOKEN_VOLUME, "mountPath": SERVICE_ACCOUNT_PATH, "readOnly": True}],
    }


def token_volume() -> dict[str, Any]:
    """The Pod's ServiceAccount token, CA and namespace, as the kubelet's automount projects them."""
    return {
        "name": TOKEN_VOLUME,
        "projected": {
            "defaultMode": 0o644,
            "sources": [
                {"serviceAccountToken": {"expirationSeconds": TOKEN_EXPIRATION_SECONDS, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {
                    "downwardAPI": {
                        "items": [
                            {"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}
                        ]
                    }
                },
            ],
        },
    }


def inject(manifest: Mapping[str, Any], *, image: str = REGISTRAR_IMAGE) -> dict[str, Any]:
    """`manifest` with the registrar injected into its Pod template (a copy; the argument is not changed)."""
    return inject_reporting(manifest, image=image).document


def inject_reporting(manifest: Mapping[str, Any], *, image: str = REGISTRAR_IMAGE) -> Injection:
    """`inject`, and which objects it injected (a List's items each)."""
    injected: list[str] = []
    document = _inject(manifest, image=image, injected=injected, context=())
    return Injection(document=document, injected=tuple(injected))


def _group(api_version: object) -> str | None:
    """The API group of an apiVersion ("" for the core group); None when there is none."""
    if not isinstance(api_version, str) or not api_version:
        return None
    return api_version.rpartition("/")[0] if "/" in api_version else ""


def template_path(obj: Mapping[str, Any]) -> tuple[str, ...] | None:
    """Where the object's Pod template is, None for a kind without one. An object without an
    apiVersion (a typed list's item, which `_inject` gives its list's) is matched by kind."""
    kind = obj.get("kind")
    group = _group(obj.get("apiVersion"))
    for (known_group, known_kind), path in TEMPLATES.items():
        if kind == known_kind and (group is None or group == known_group):
            return path
    return None


def _inject(
    manifest: Mapping[str, Any], *, image: str, injected: list[str], context: tuple[str, ...]
) -> dict[str, Any]:
    document = copy.deepcopy(dict(manifest))
    kind = document.get("kind")
    if isinstance(kind, str) and kind.endswith("List") and isinstance(document.get("items"), list):
        document["items"] = [
            _inject_item(item, of=document, image=image, injected=injected, context=(*context, f"{kind} item {index}"))
            for index, item in enumerate(document["items"])
        ]
        return document
    path = template_path(document)
    if path is None:
        return document
    what = describe(document) + (f" ({', '.join(context)})" if context else "")
    template: Any = document
    for index, key in enumerate(path):
        here = template.get(key)
        if not isinstance(here, dict):
            where = ".".join(path[: index + 1])
            raise InjectionRefused(
                what,
                f"it has no Pod template at {'.'.join(path)} ({where} is missing or not an object); fix the manifest",
            )
        template = here
    _inject_template(template, image=image, what=what, prefix=".".join(path))
    injected.append(what)
    return document


def _inject_item(item: Any, *, of: Mapping[str, Any], image: str, injected: list[str], context: tuple[str, ...]) -> Any:
    """One item of a List; a typed list's items (PodList, DeploymentList) carry no kind or apiVersion:
    they are the list's, and stay unsaid."""
    if not isinstance(item, Mapping):
        return item
    kind = str(of["kind"]).removesuffix("List")
    if not kind or "kind" in item:
        return _inject(item, image=image, injected=injected, context=context)
    typed = {"apiVersion": of.get("apiVersion"), "kind": kind, **item}
    done = _inject(typed, image=image, injected=injected, context=context)
    return {key: value for key, value in done.items() if key not in ("apiVersion", "kind")}


def refusal(spec: Mapping[str, Any], *, where: str = "spec") -> str | None:
    """Why the registrar cannot work in a Pod of this spec (and the fix), or None. The admission
    policy's twin (manifests/components/registrar-injection, coroner-registrar-injectable) refuses the
    same Pods."""
    if spec.get("hostPID") is True:
        return (
            f"{where} sets hostPID: true, so its containers share the node's pid namespace rather than one of "
            "their own (shareProcessNamespace), where the registrar finds each container's main process; remove "
            "hostPID, or register the worker with `coroner run` in its image"
        )
    if spec.get("shareProcessNamespace") is False:
        return (
            f"{where} sets shareProcessNamespace: false, and the registrar sees the other containers' processes "
            "only in a shared pid namespace; remove the field (inject sets it true), or register the worker with "
            "`coroner run` in its image"
        )
    os_ = spec.get("os")
    if isinstance(os_, Mapping) and os_.get("name") == "windows":
        return f"{where} runs on Windows (os.name: windows), and the registrar reads Linux's /proc; leave it out"
    for field in ("containers", "ephemeralContainers"):
        for item in spec.get(field) or []:
            if isinstance(item, Mapping) and item.get("name") == CONTAINER_NAME:
                return (
                    f"{where} already has a container named {CONTAINER_NAME} in {field} (the name of the "
                    "registrar's init container); rename that container"
                )
    return None


def _list_of_objects(spec: Mapping[str, Any], field: str, *, what: str, where: str) -> list[Any]:
    value = spec.get(field)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, Mapping) for item in value):
        raise InjectionRefused(what, f"{where}.{field} is not a list of objects; fix the manifest")
    return value


def _inject_template(template: dict[str, Any], *, image: str, what: str, prefix: str) -> None:
    """Injects into one Pod template (or Pod: `prefix` "") in place: its `metadata` and `spec`."""
    at = f"{prefix}." if prefix else ""
    spec = template.get("spec")
    if not isinstance(spec, dict):
        raise InjectionRefused(what, f"{at}spec is missing or not an object; fix the manifest")
    for field in ("containers", "ephemeralContainers"):
        _list_of_objects(spec, field, what=what, where=f"{at}spec")
    why = refusal(spec, where=f"{at}spec")
    if why is not None:
        raise InjectionRefused(what, why)
    inits = _list_of_objects(spec, "initContainers", what=what, where=f"{at}spec")
    volumes = _list_of_objects(spec, "volumes", what=what, where=f"{at}spec")
    metadata = template.get("metadata")
    if metadata is None:
        metadata = template["metadata"] = {}
    if not isinstance(metadata, dict):
        raise InjectionRefused(what, f"{at}metadata is not an object; fix the manifest")
    annotations = metadata.get("annotations")
    if annotations is None:
        annotations = metadata["annotations"] = {}
    if not isinstance(annotations, dict):
        raise InjectionRefused(what, f"{at}metadata.annotations is not an object; fix the manifest")
    spec["shareProcessNamespace"] = True
    spec["initContainers"] = [container(image), *(c for c in inits if c.get("name") != CONTAINER_NAME)]
    spec["volumes"] = [*(v for v in volumes if v.get("name") != TOKEN_VOLUME), token_volume()]
    annotations[INJECTED_ANNOTATION] = INJECTION_VERSION
