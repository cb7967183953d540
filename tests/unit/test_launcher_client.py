"""The launcher's client: a kubeconfig it cannot use is a RegistrationError naming the fix (exit
125 from `coroner run`), never a traceback, and the worker is not started unregistered."""

from __future__ import annotations

import json
import pathlib

import pytest
import urllib3

from coroner import launcher
from coroner.core import api, kubewire, procfs, wire

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


#: A SelfSubjectReview's answer to a pod-bound ServiceAccount token.
REVIEWED = {
    "status": {
        "userInfo": {
            "username": "system:serviceaccount:jobs:worker",
            "extra": {
                "authentication.kubernetes.io/pod-name": ["worker-0"],
                "authentication.kubernetes.io/pod-uid": ["5e1f"],
            },
        }
    }
}


class Flaky:
    """A client whose creates are answered with `statuses` first (the API server warming up after a
    CRD was created: 503 "Resource kind ... not found"), then created; it says who it is with
    `review` (an exception: the review fails)."""

    def __init__(
        self, *statuses: int | tuple[int, str] | Exception, review: dict[str, object] | Exception = REVIEWED
    ) -> None:
        self.statuses = [(s, "not yet") if isinstance(s, int) else s for s in statuses]
        self.review = review
        self.posts = 0
        self.bodies: list[dict[str, object]] = []

    def request(self, method: str, path: str, **kwargs: object) -> dict[str, object]:
        assert method == "POST"
        if path == kubewire.SELF_SUBJECT_REVIEW_PATH:
            if isinstance(self.review, Exception):
                raise self.review
            return self.review
        self.posts += 1
        self.bodies.append(dict(kwargs["body"]))  # type: ignore[call-overload]
        if self.statuses:
            raise _refusal(self.statuses.pop(0))
        return dict(kwargs["body"])  # type: ignore[call-overload]


def _refusal(answer: tuple[int, str] | Exception) -> Exception:
    if isinstance(answer, Exception):
        return answer
    status, message = answer
    return launcher.ApiError(status, "Refused", json.dumps({"kind": "Status", "message": message}))


def _register(client: Flaky) -> launcher.Held:
    return launcher.register(
        client=client,  # type: ignore[arg-type]
        namespace="n",
        node_name="node-a",
        incarnation=procfs.ProcessIncarnation(boot_id="b", pid_namespace=4026531836, pid=7, start_time=1, host_id="h"),
        name="w",
    )


#: What a restarting API server's admission answers until its policies have synced.
NOT_READY = (403, 'workerregistrations.coroner.dev "w" is forbidden: not yet ready to handle request')
RBAC = (403, 'workerregistrations.coroner.dev is forbidden: User "system:serviceaccount:n:w" cannot create resource '
        '"workerregistrations" in API group "coroner.dev" in the namespace "n"')  # fmt: skip
POLICY = (403, 'workerregistrations.coroner.dev "w" is forbidden: ValidatingAdmissionPolicy '
          "'coroner-registration-node' with binding 'coroner-registration-node' denied request: not this node")  # fmt: skip


def test_registration_outlasts_a_busy_or_warming_api_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launcher.time, "sleep", lambda _seconds: None)
    client = Flaky(503, 429, 500, (401, "Unauthorized"), NOT_READY)
    assert _register(client).name == "w"
    assert client.posts == 6


def test_registration_outlasts_an_unreachable_api_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launcher.time, "sleep", lambda _seconds: None)
    client = Flaky(urllib3.exceptions.ProtocolError("Connection aborted."), 503)
    assert _register(client).name == "w"
    assert client.posts == 3


class Goodbyes:
    """A client whose goodbyes (server-side applies of Released) are answered with `answers` first."""

    def __init__(self, *answers: int | tuple[int, str] | Exception) -> None:
        self.answers = [(a, "not yet") if isinstance(a, int) else a for a in answers]
        self.applies = 0

    def request(self, method: str, path: str, **kwargs: object) -> dict[str, object]:
        assert (method, path) == ("PATCH", "/apis/coroner.dev/v1alpha1/namespaces/n/workerregistrations/w/status")
        assert kwargs["content_type"] == wire.APPLY_PATCH
        self.applies += 1
        if self.answers:
            raise _refusal(self.answers.pop(0))
        return {}


def _held_by(client: Goodbyes) -> launcher.Held:
    held = _register(Flaky())
    held.client = client  # type: ignore[assignment]
    return held


def test_the_goodbye_outlasts_a_restarting_api_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launcher.time, "sleep", lambda _seconds: None)
    client = Goodbyes(urllib3.exceptions.ProtocolError("Connection aborted."), 503, (401, "Unauthorized"), NOT_READY)
    _held_by(client).release(message="the worker exited cleanly (status 0)")
    assert client.applies == 5


def test_a_goodbye_that_never_lands_is_said_not_raised(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The worker's exit status stands; the registration is retired once the agent confirms the exit."""
    clock = iter(range(0, 10_000, 5))
    monkeypatch.setattr(launcher.time, "monotonic", lambda: float(next(clock)))
    monkeypatch.setattr(launcher.time, "sleep", lambda _seconds: None)
    client = Goodbyes(*[503] * 100)
    launcher.say_goodbye(_held_by(client), message="the worker exited cleanly (status 0)")
    assert 1 < client.applies < 100
    assert "the goodbye of n/w did not land" in caplog.text
    assert "is retired then" in caplog.text


def test_registration_gives_up_on_a_server_that_stays_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter(range(0, 10_000, 5))
    monkeypatch.setattr(launcher.time, "monotonic", lambda: float(next(clock)))
    monkeypatch.setattr(launcher.time, "sleep", lambda _seconds: None)
    with pytest.raises(
        launcher.RegistrationError, match=r"n/w failed: 503 .*still busy, unavailable or warming up after"
    ):
        _register(Flaky(*[503] * 100))
    with pytest.raises(launcher.RegistrationError, match=r"n/w failed: 401 .*check this identity's token"):
        _register(Flaky(*[(401, "Unauthorized")] * 100))


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        pytest.param((422, "spec.nodeName: Required value"), "422", id="invalid"),
        pytest.param(
            RBAC, "not allowed to create WorkerRegistrations in namespace 'n'; bind the ClusterRole", id="rbac"
        ),
        pytest.param(
            POLICY, "the API server refused registering n/w: .*'coroner-registration-node'.*not this node", id="policy"
        ),
    ],
)
def test_a_refusal_is_not_retried_and_says_what_refused(answer: tuple[int, str], said: str) -> None:
    client = Flaky(answer)
    with pytest.raises(launcher.RegistrationError, match=said) as raised:
        _register(client)
    assert client.posts == 1
    assert answer is RBAC or "ClusterRole" not in str(raised.value)


def test_the_launcher_names_its_registrant_as_admission_does() -> None:
    """Admission admits a registration only when it names exactly its requester."""
    client = Flaky()
    _register(client)
    annotations = client.bodies[0]["metadata"]["annotations"]  # type: ignore[index]
    assert annotations == {api.REGISTERED_BY_ANNOTATION: "system:serviceaccount:jobs:worker pod/worker-0/5e1f"}


@pytest.mark.parametrize(
    ("review", "said"),
    [
        (launcher.ApiError(503, "Service Unavailable", "warming"), "asking the API server who registers n/w failed"),
        (launcher.ApiError(403, "Forbidden", "no"), "must name its registrant"),
        (ConnectionRefusedError("refused"), "asking the API server who registers n/w failed"),
        ({"status": {}}, "named no user"),
    ],
    ids=["503-past-patience", "refused", "unreachable", "no-user"],
)
def test_without_an_answer_nothing_is_registered_and_the_error_says_why(
    monkeypatch: pytest.MonkeyPatch, review: object, said: str
) -> None:
    clock = iter(range(0, 10_000, 10))
    monkeypatch.setattr(launcher.time, "monotonic", lambda: float(next(clock)))
    monkeypatch.setattr(launcher.time, "sleep", lambda _seconds: None)
    client = Flaky(review=review)  # type: ignore[arg-type]
    with pytest.raises(launcher.RegistrationError, match=said):
        _register(client)
    assert client.posts == 0
