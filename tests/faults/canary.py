"""When the API server enforces a change of admission policy bindings: a canary binding.

The API server applies a binding created or deleted through an informer and a periodic refresh of
its compiled policies, so there is no answer to "is it in force yet?" but a request that meets it.
The canary is a policy of the harness's own that refuses one dry-run ConfigMap carrying its label;
a refusal of that probe proves the API server's snapshot of bindings holds the canary's binding,
an admission that it does not. Bindings reach the snapshot in the order they were written (one
informer, in resourceVersion order), so writing the canary's binding *after* other bindings and
seeing its probe flip proves those earlier writes are in force too.
"""

from __future__ import annotations

import time
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

NAME = "faults-admission-canary"
LABEL = "faults.coroner.dev/canary"


def _policy() -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": NAME},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["configmaps"]}
                ]
            },
            "validations": [
                {
                    "expression": f"!has(object.metadata.labels) || !('{LABEL}' in object.metadata.labels)",
                    "message": "the fault harness's admission canary",
                }
            ],
        },
    }


def _binding() -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": NAME},
        "spec": {"policyName": NAME, "validationActions": ["Deny"]},
    }


class Canary:
    """The canary on one API server (`client`: an admin ApiClient); `retry` rides out restarts."""

    def __init__(self, client: k8s.ApiClient, retry: Any, namespace: str = "default") -> None:
        self._admission = k8s.AdmissionregistrationV1Api(client)
        self._core = k8s.CoreV1Api(client)
        self._retry = retry
        self._namespace = namespace

    def _create(self, call: Any, body: dict[str, Any]) -> None:
        try:
            self._retry(lambda: call(body))
        except ApiException as exc:
            if exc.status != 409:
                raise

    def _refused(self) -> bool:
        probe = {"metadata": {"generateName": "canary-", "labels": {LABEL: "probe"}}}
        try:
            self._retry(lambda: self._core.create_namespaced_config_map(self._namespace, probe, dry_run="All"))
        except ApiException as exc:
            if exc.status in (403, 422) and NAME in str(exc.body):
                return True
            raise
        return False

    def _until(self, refused: bool, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self._refused() != refused:
            if time.monotonic() > deadline:
                state = "enforced" if refused else "lifted"
                raise RuntimeError(f"the admission canary was not {state} within {timeout:.0f} s")
            time.sleep(0.1)

    def bind(self, timeout: float = 60.0) -> None:
        """Binds the canary after every binding written before, and returns once it is enforced."""
        self._create(self._admission.create_validating_admission_policy, _policy())
        self._create(self._admission.create_validating_admission_policy_binding, _binding())
        self._until(True, timeout)

    def unbind(self, timeout: float = 60.0) -> None:
        """Deletes the canary's binding after every binding deleted before, and returns once it is
        no longer enforced."""
        try:
            self._retry(lambda: self._admission.delete_validating_admission_policy_binding(NAME))
        except ApiException as exc:
            if exc.status != 404:
                raise
        self._until(False, timeout)
