"""`kubectl coroner apply`'s retirement runs the one retire protocol over the person's Session: each
answer of the API server (as the kubernetes package raises it) to its row, and what is written."""

from __future__ import annotations

import datetime
import json
from typing import Any

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from coroner.cli import plan as planning
from coroner.cli.commands import apply
from coroner.cli.session import PluginError
from coroner.core import api
from coroner.core.decision import Policy
from coroner.core.fingerprint import decide_all
from coroner.core.model import format_time
from coroner.core.world import World
from unit.builders import BOOT, HOST, NAME, NAMESPACE, NODE, NODE_UID, NOW, make_registration

pytestmark = pytest.mark.unit

Row = planning.RowOutcome


class FakeSession:
    server = "https://127.0.0.1:6443"
    client = object()

    def __init__(
        self,
        *,
        granted: bool | BaseException | None = True,
        leases: list[dict[str, Any]] | BaseException | None = None,
        event: BaseException | None = None,
    ) -> None:
        self.granted = granted
        self.leases = leases if leases is not None else []
        self.event = event
        self.events: list[dict[str, Any]] = []

    def can_retire(self, *, namespace: str, name: str | None = None) -> bool | None:
        if isinstance(self.granted, BaseException):
            raise self.granted
        return self.granted

    def list_leases(self, *, namespace: str | None) -> list[dict[str, Any]]:
        if isinstance(self.leases, BaseException):
            raise self.leases
        return self.leases

    def post_event(self, *, body: dict[str, Any], reason: str, message: str, reporter: str) -> None:
        if self.event is not None:
            raise self.event
        self.events.append({"body": body, "reason": reason, "message": message, "reporter": reporter})

    def unreachable(self, exc: BaseException) -> PluginError:
        return PluginError(f"cannot reach the Kubernetes API server at {self.server}", unreachable=True)


def world() -> World:
    w = World(system_namespace=api.SYSTEM_NAMESPACE)
    w.put_registration(make_registration())
    w.put_node({"metadata": {"name": NODE, "uid": NODE_UID}, "status": {"nodeInfo": {"bootID": BOOT}}})
    w.put_lease(
        {
            "metadata": {"namespace": api.SYSTEM_NAMESPACE, "name": f"{api.AGENT_LEASE_PREFIX}{NODE}",
                         "annotations": {api.AGENT_LEASE_BOOT_ID: BOOT, api.AGENT_LEASE_HOST_ID: HOST}},
            "spec": {"holderIdentity": "agent", "renewTime": format_time(NOW - datetime.timedelta(seconds=5)),
                     "leaseDurationSeconds": 40},
        }
    )  # fmt: skip
    w.set_retire_permission(NAMESPACE, True)
    return w


def retire(
    monkeypatch: pytest.MonkeyPatch, session: FakeSession, *, patch: BaseException | None = None
) -> tuple[planning.RowResult, list[list[dict[str, Any]]]]:
    patches: list[list[dict[str, Any]]] = []

    def patch_registration_status(client: object, *, namespace: str, name: str, body: list[dict[str, Any]]) -> Any:
        patches.append(body)
        if patch is not None:
            raise patch
        return {"metadata": {"namespace": namespace, "name": name, "resourceVersion": "1002"}}

    monkeypatch.setattr(apply, "patch_registration_status", patch_registration_status)
    monkeypatch.setattr(apply, "utcnow", lambda: NOW)
    w = world()
    (entry,) = decide_all(world=w, policy=Policy(), now=NOW).entries
    assert entry.decision.retirable
    row = apply._retire(session, world=w, entry=entry, policy=Policy(), retired_by="alice")  # type: ignore[arg-type]
    return row, patches


def test_a_retirement_records_the_person_and_posts_the_event(monkeypatch: pytest.MonkeyPatch) -> None:
    session = FakeSession()
    row, patches = retire(monkeypatch, session)
    assert row.outcome is Row.RETIRED and row.evidence == "PidfdExited" and row.detail.startswith("PidfdExited: ")
    (ops,) = patches
    assert ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "1001"}
    retirement = next(op["value"] for op in ops if op["path"] == "/status/retirement")
    assert retirement["retiredBy"] == "alice"
    (event,) = session.events
    assert event["reporter"] == "alice" and event["reason"] == "Retired"
    assert event["message"].startswith("PidfdExited: retired by alice with kubectl coroner apply: ")


def _denied(status: int, policy: str) -> ApiException:
    """A ValidatingAdmissionPolicy's refusal, as kube-apiserver answers it."""
    said = "retiring WorkerRegistration jobs/w requires the retire verb" if "capability" in policy else "not here"
    message = (
        f"workerregistrations.coroner.dev \"w\" is forbidden: ValidatingAdmissionPolicy '{policy}' with binding "
        f"'{policy}-binding' denied request: {said}"
    )
    exc = ApiException(status=status, reason="Forbidden" if status == 403 else "Unprocessable Entity")
    exc.body = json.dumps({"kind": "Status", "message": message, "code": status})
    return exc


def test_an_admission_refusal_names_the_object_the_policy_and_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    row, _ = retire(monkeypatch, FakeSession(), patch=_denied(403, "deny-retirements"))
    assert row.outcome is Row.RETIRE_REFUSED_BY_ADMISSION and row.outcome.value == "RetireRefusedByAdmission"
    assert f"WorkerRegistration {NAMESPACE}/{NAME}" in row.detail
    assert "ValidatingAdmissionPolicy deny-retirements (binding deny-retirements-binding)" in row.detail
    assert "not here" in row.detail
    assert "`kubectl get validatingadmissionpolicy deny-retirements -o yaml`" in row.detail
    assert not row.outcome.done and planning.apply_exit_code([row]) == 2


@pytest.mark.parametrize(
    ("error", "outcome", "says"),
    [
        (ApiException(status=409, reason="Conflict"), Row.RETIRE_CONFLICT, "it moved, nothing written; plan again."),
        (ApiException(status=422, reason="Invalid"), Row.RETIRE_CONFLICT, "plan again."),
        (ApiException(status=404, reason="NotFound"), Row.RETIRE_CONFLICT, "plan again."),
        (ApiException(status=403, reason="Forbidden"), Row.RETIRE_PERMISSION_MISSING, "refused the retirement"),
        (ApiException(status=0, reason="no answer"), Row.RETIRE_FAILED, "Plan again to see whether it landed."),
        (urllib3.exceptions.ProtocolError("reset"), Row.RETIRE_FAILED, "Plan again to see whether it landed."),
        (ApiException(status=500, reason="InternalError"), Row.RETIRE_FAILED, "500 InternalError"),
        (_denied(403, "deny-retirements"), Row.RETIRE_REFUSED_BY_ADMISSION, "a policy that is not Coroner's"),
        (_denied(422, "deny-retirements"), Row.RETIRE_REFUSED_BY_ADMISSION, "retire grant is not the problem"),
        (_denied(403, "coroner-retire-requires-evidence"), Row.RETIRE_REFUSED_BY_ADMISSION, "plan again"),
        (_denied(403, "coroner-retire-requires-capability"), Row.RETIRE_PERMISSION_MISSING, "requires the retire"),
    ],
)
def test_each_answer_to_the_write_to_its_row(
    monkeypatch: pytest.MonkeyPatch, error: BaseException, outcome: Row, says: str
) -> None:
    session = FakeSession()
    row, patches = retire(monkeypatch, session, patch=error)
    assert row.outcome is outcome and says in row.detail, row.detail
    assert len(patches) == 1 and session.events == [] and row.evidence is None


@pytest.mark.parametrize(
    ("session", "outcome", "says"),
    [
        (FakeSession(granted=False), Row.RETIRE_PERMISSION_MISSING, "alice does not hold the retire verb"),
        (FakeSession(granted=None), Row.RETIRE_PERMISSION_MISSING, "does not hold the retire verb"),
        (
            FakeSession(granted=PluginError("cannot reach the Kubernetes API server", unreachable=True)),
            Row.RETIRE_FAILED,
            "cannot reach the Kubernetes API server Nothing written.",
        ),
        (
            FakeSession(leases=PluginError("forbidden to list leases", status=403)),
            Row.RETIRE_FAILED,
            "forbidden to list leases Nothing written.",
        ),
        (
            FakeSession(
                leases=[{"metadata": {"namespace": NAMESPACE, "name": "lock"}, "spec": {"holderIdentity": NAME}}]
            ),
            Row.RETIRE_ABANDONED,
            "changed holders",
        ),
    ],
)
def test_nothing_is_written_unless_the_review_and_the_fence_allow_it(
    monkeypatch: pytest.MonkeyPatch, session: FakeSession, outcome: Row, says: str
) -> None:
    row, patches = retire(monkeypatch, session)
    assert row.outcome is outcome and says in row.detail, row.detail
    assert patches == []


def test_a_failed_event_is_a_warning_and_the_row_is_retired(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    row, _ = retire(monkeypatch, FakeSession(event=PluginError("forbidden to post the Retired Event", status=403)))
    assert row.outcome is Row.RETIRED
    assert "was retired but its Event was not posted: forbidden to post the Retired Event" in capsys.readouterr().err
