"""`kubectl coroner inject` as its console script runs it (the same click group, in this process: it
makes no request): multi-document YAML and JSON from files, a directory and standard input, printed
as YAML in the order read; its own output injected again is the same text; a refusal prints nothing
on stdout and names the file, the document, the object and the fix (exit 2)."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result

from coroner.cli import kubectl as plugin_cli
from coroner.core import inject

pytestmark = pytest.mark.unit

DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: jobs
spec:
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
        - name: web
          image: registry.example/web:1.0
"""
SERVICE = """\
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: jobs
  annotations:
    deployed-at: 2026-01-02T03:04:05Z
spec:
  ports:
    - port: 80
"""
CONFIG = """\
apiVersion: v1
kind: ConfigMap
metadata: {name: script, namespace: jobs}
data:
  run.sh: |
    #!/bin/sh
    exec /app --verbose
"""
JOB = {
    "apiVersion": "batch/v1",
    "kind": "Job",
    "metadata": {"name": "once", "namespace": "jobs"},
    "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "j", "image": "j:1"}]}}},
}


def run(*args: str, stdin: str | None = None) -> Result:
    return CliRunner().invoke(plugin_cli.main, ["inject", *args], input=stdin, catch_exceptions=False)


def documents(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d is not None]


@pytest.fixture
def multi(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "app.yaml"
    path.write_text(f"---\n{DEPLOYMENT}---\n{SERVICE}---\n# only a comment\n---\n{CONFIG}")
    return path


def test_a_multi_document_file_is_printed_in_order_with_the_workload_injected(multi: pathlib.Path) -> None:
    result = run("-f", str(multi))
    assert result.exit_code == 0, result.stderr
    got = documents(result.stdout)
    assert [(d["kind"], d["metadata"]["name"]) for d in got] == [
        ("Deployment", "web"),
        ("Service", "web"),
        ("ConfigMap", "script"),
    ]
    assert got[0] == inject.inject(yaml.safe_load(DEPLOYMENT))
    assert got[1:] == [yaml.safe_load(SERVICE) | {"metadata": got[1]["metadata"]}, yaml.safe_load(CONFIG)]
    # What a transform must not change: a timestamp stays the string it was, a script a literal block.
    assert got[1]["metadata"]["annotations"] == {"deployed-at": "2026-01-02T03:04:05Z"}
    assert "  run.sh: |\n    #!/bin/sh\n    exec /app --verbose\n" in result.stdout
    assert result.stdout.count("\n---\n") == 2 and not result.stdout.startswith("---")
    assert result.stderr == f"Deployment jobs/web injected ({multi}, document 1)\n"


def test_its_output_injected_again_is_the_same_text(multi: pathlib.Path) -> None:
    once = run("-f", str(multi)).stdout
    again = run("-f", "-", stdin=once)
    assert again.exit_code == 0
    assert again.stdout == once


def test_stdin_json_and_yaml_and_several_inputs_in_the_order_given(tmp_path: pathlib.Path) -> None:
    job = tmp_path / "job.json"
    job.write_text(json.dumps(JOB, indent=2))
    result = run("-f", str(job), "-f", "-", stdin=DEPLOYMENT + "---\n" + json.dumps(JOB))
    assert result.exit_code == 0, result.stderr
    got = documents(result.stdout)
    assert got == [inject.inject(JOB), inject.inject(yaml.safe_load(DEPLOYMENT)), inject.inject(JOB)]
    assert result.stderr.splitlines() == [
        f"Job jobs/once injected ({job}, document 1)",
        "Deployment jobs/web injected (stdin, document 1)",
        "Job jobs/once injected (stdin, document 2)",
    ]


def test_a_directory_is_read_with_its_subdirectories_in_name_order(tmp_path: pathlib.Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "deploy.yml").write_text(DEPLOYMENT)
    (tmp_path / "a.json").write_text(json.dumps(JOB))
    (tmp_path / "README.md").write_text("not a manifest: {")
    got = documents(run("-f", str(tmp_path)).stdout)
    assert [d["kind"] for d in got] == ["Job", "Deployment"]


def test_a_list_as_kubectl_get_prints_it() -> None:
    listed = {
        "apiVersion": "v1",
        "kind": "List",
        "metadata": {"resourceVersion": ""},
        "items": [yaml.safe_load(DEPLOYMENT), JOB],
    }
    result = run("-f", "-", stdin=yaml.safe_dump(listed))
    assert documents(result.stdout) == [inject.inject(listed)]
    assert "Job jobs/once (List item 1) injected (stdin, document 1)" in result.stderr


def test_the_image_can_be_overridden() -> None:
    result = run("--image", "mirror.example/coroner-registrar:v0.1.0", "-f", "-", stdin=DEPLOYMENT)
    (got,) = documents(result.stdout)
    assert got["spec"]["template"]["spec"]["initContainers"][0]["image"] == "mirror.example/coroner-registrar:v0.1.0"
    assert run("--image", "two words", "-f", "-", stdin=DEPLOYMENT).exit_code == 2


def test_a_refusal_prints_nothing_and_names_every_refused_object_and_the_fix(multi: pathlib.Path) -> None:
    host = yaml.safe_load(DEPLOYMENT)
    host["spec"]["template"]["spec"]["hostPID"] = True
    stdin = yaml.safe_dump(host) + "---\n" + json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}})
    result = run("-f", str(multi), "-f", "-", stdin=stdin)
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "error: stdin, document 1: cannot inject the registrar into Deployment jobs/web: spec.template.spec sets "
        "hostPID: true, so its containers share the node's pid namespace rather than one of their own "
        "(shareProcessNamespace), where the registrar finds each container's main process; remove hostPID, or "
        "register the worker with `coroner run` in its image.",
        "error: stdin, document 2: cannot inject the registrar into Pod p: spec is missing or not an object; fix the manifest.",
    ]


@pytest.mark.parametrize(
    ("stdin", "message"),
    [
        ("kind: [", "error: stdin is not valid YAML or JSON ("),
        ("- a\n- b\n", "error: stdin, document 1 is a list, not a Kubernetes object"),
        ("", "error: no object in -; give inject the manifests to change."),
    ],
)
def test_input_that_is_not_a_manifest_is_one_sentence(stdin: str, message: str) -> None:
    result = run("-f", "-", stdin=stdin)
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.startswith(message) and len(result.stderr.splitlines()) == 1


def test_a_missing_file_is_one_sentence(tmp_path: pathlib.Path) -> None:
    result = run("-f", str(tmp_path / "nope.yaml"))
    assert result.exit_code == 2
    assert (
        result.stderr
        == f"error: {tmp_path / 'nope.yaml'} does not exist; give a file, a directory or - (standard input) to -f.\n"
    )


def test_nothing_to_inject_is_a_warning_not_an_error() -> None:
    result = run("-f", "-", stdin=SERVICE)
    assert result.exit_code == 0
    assert documents(result.stdout) == [yaml.safe_load(SERVICE) | {"metadata": documents(result.stdout)[0]["metadata"]}]
    assert result.stderr == "warning: no Pod template in the input: nothing was injected.\n"
