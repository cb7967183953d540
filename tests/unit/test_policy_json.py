"""`coroner.core.policy_json`: the policy the operator publishes, read back exactly or not at all."""

from __future__ import annotations

import dataclasses
import json

import pytest

from coroner.core import policy_json
from coroner.core.decision import Policy
from coroner.core.policy_json import PolicyUnreadable, dump_policy, parse_policy

pytestmark = pytest.mark.unit

DEFAULT = json.loads(dump_policy(Policy()))


def with_(**changes: object) -> str:
    return json.dumps({**DEFAULT, **changes})


def without(key: str) -> str:
    return json.dumps({k: v for k, v in DEFAULT.items() if k != key})


def test_every_field_of_the_policy_is_published_under_its_camel_case_name() -> None:
    names = [field.name for field in dataclasses.fields(Policy)]
    assert list(policy_json.FIELD_NAMES.values()) == names
    assert set(DEFAULT) == set(policy_json.FIELD_NAMES)
    assert policy_json.FIELD_NAMES["nodeDeletionQuarantineSeconds"] == "node_deletion_quarantine_seconds"
    assert policy_json.camel("node_out_of_service_evidence") == "nodeOutOfServiceEvidence"


@pytest.mark.parametrize(
    "policy",
    [
        pytest.param(Policy(), id="defaults"),
        pytest.param(Policy(node_deletion_evidence=True, node_deletion_quarantine_seconds=300), id="node-loss"),
        pytest.param(Policy(node_out_of_service_evidence=False), id="no-taint"),
        pytest.param(
            Policy(
                absence_confirm_seconds=0,
                pidfd_exited_window_intervals=1.5,
                proc_absent_window_intervals=0.25,
                boot_boundary_window_intervals=7,
            ),
            id="odd-numbers",
        ),
    ],
)
def test_round_trip(policy: Policy) -> None:
    raw = dump_policy(policy)
    assert parse_policy(raw) == policy
    assert dump_policy(parse_policy(raw)) == raw  # type: ignore[arg-type]
    assert raw == json.dumps(json.loads(raw), sort_keys=True, separators=(",", ":")), "stable bytes"


def test_integers_are_numbers() -> None:
    parsed = parse_policy(with_(nodeDeletionQuarantineSeconds=300))
    assert isinstance(parsed, Policy) and parsed.node_deletion_quarantine_seconds == 300.0


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        pytest.param(None, "not a string", id="absent"),
        pytest.param(b"{}", "not a string", id="bytes"),
        pytest.param("", "not JSON", id="empty"),
        pytest.param("{not json", "not JSON", id="garbled"),
        pytest.param("[" * 100_000, "not JSON", id="deeply-nested"),
        pytest.param("[]", "not a JSON object", id="a-list"),
        pytest.param('"policy"', "not a JSON object", id="a-string"),
        pytest.param("null", "not a JSON object", id="null"),
        pytest.param("{}", "lacks field(s) absenceConfirmSeconds", id="empty-object"),
        pytest.param(without("nodeDeletionEvidence"), "lacks field(s) nodeDeletionEvidence", id="missing-field"),
        pytest.param(with_(nodeLossMagic=True), "does not know (nodeLossMagic)", id="unknown-field"),
        pytest.param(with_(node_deletion_evidence=True), "does not know (node_deletion_evidence)", id="snake-case"),
        pytest.param(with_(nodeDeletionEvidence="true"), "not true or false", id="bool-as-string"),
        pytest.param(with_(nodeDeletionEvidence=1), "not true or false", id="bool-as-number"),
        pytest.param(with_(nodeDeletionEvidence=None), "not true or false", id="bool-null"),
        pytest.param(with_(nodeDeletionQuarantineSeconds="40"), "not a number", id="number-as-string"),
        pytest.param(with_(nodeDeletionQuarantineSeconds=True), "not a number", id="number-as-bool"),
        pytest.param(with_(nodeDeletionQuarantineSeconds=None), "not a number", id="number-null"),
        pytest.param(with_(nodeDeletionQuarantineSeconds=[40]), "not a number", id="number-in-a-list"),
        pytest.param(with_(nodeDeletionQuarantineSeconds=-1), "the Policy refuses it", id="negative"),
        pytest.param(
            with_().replace('"nodeDeletionQuarantineSeconds": 40.0', '"nodeDeletionQuarantineSeconds": NaN'),
            "not a finite number",
            id="nan",
        ),
        pytest.param(
            with_().replace('"absenceConfirmSeconds": 10.0', '"absenceConfirmSeconds": 1e999'),
            "not a finite number",
            id="infinity",
        ),
        pytest.param(
            with_().replace('"absenceConfirmSeconds": 10.0', '"absenceConfirmSeconds": 1' + "0" * 400),
            "not a finite number",
            id="huge-integer",
        ),
    ],
)
def test_anything_else_is_unreadable_never_a_default(raw: object, why: str) -> None:
    parsed = parse_policy(raw)
    assert isinstance(parsed, PolicyUnreadable), parsed
    assert why in parsed.reason
