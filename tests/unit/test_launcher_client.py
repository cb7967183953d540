"""The launcher's client: a kubeconfig it cannot use is a RegistrationError naming the fix (exit
125 from `coroner run`), never a traceback, and the worker is not started unregistered."""

from __future__ import annotations

import json
import pathlib

import pytest

from coroner import launcher

pytestmark = pytest.mark.unit


def kubeconfig(tmp_path: pathlib.Path, user: dict[str, object]) -> pathlib.Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "c",
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": user}],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(config))
    return path


@pytest.mark.parametrize(
    ("user", "said"),
    [
        pytest.param({"exec": {"command": "aws"}}, "authenticates with 'exec'", id="exec-plugin"),
        pytest.param({"tokenFile": "no-such-token"}, None, id="usable"),
    ],
)
def test_a_kubeconfig_the_launcher_cannot_use_is_a_registration_error(
    tmp_path: pathlib.Path, user: dict[str, object], said: str | None
) -> None:
    path = kubeconfig(tmp_path, user)
    if said is None:
        assert launcher.client_for(str(path)).server == "https://127.0.0.1:1"
        return
    with pytest.raises(launcher.RegistrationError, match=said):
        launcher.client_for(str(path))


def test_a_missing_kubeconfig_is_a_registration_error(tmp_path: pathlib.Path) -> None:
    with pytest.raises(launcher.RegistrationError, match="kubeconfig"):
        launcher.client_for(str(tmp_path / "absent"))


def test_run_starts_no_worker_without_a_client(tmp_path: pathlib.Path) -> None:
    marker = tmp_path / "started"
    with pytest.raises(launcher.RegistrationError):
        launcher.run(
            ["touch", str(marker)],
            namespace="n",
            node_name="node-a",
            kubeconfig=str(kubeconfig(tmp_path, {"exec": {"command": "aws"}})),
        )
    assert not marker.exists()
