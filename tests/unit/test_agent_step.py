"""The agent's attest step (`coroner_agent.step.attest`): pure, so every answer is a table row or a
property over generated inputs — no agent, no queue, no clock.

What it must never do: write Dead unless the probe found exactly this incarnation dead (a death
read from /proc only once seen twice, the window apart), speak for another node, write what the
stored attestation already says, or write anything for a terminal registration.
"""

from __future__ import annotations

import copy
import datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coroner.core import exits, model
from coroner.core.exits import Ending, Exit
from coroner.core.reasons import Evidence, Verdict
from coroner_agent import step
from coroner_agent.effects import AgentEffects, FirstLook
from coroner_agent.verdict import ProbeResult
from unit.builders import BOOT, HOST, NODE, NOW, make_registration

pytestmark = pytest.mark.unit

WINDOW = 10.0
ATTESTER = step.Attester(node_name=NODE, pod_name="coroner-agent-x", identity="agent", absence_confirm_seconds=WINDOW)
KEY = ("jobs", "w")
SECOND = datetime.timedelta(seconds=1)

ALIVE = (Verdict.ALIVE, Evidence.PIDFD_PINNED)
EXITED = (Verdict.DEAD, Evidence.PIDFD_EXITED)
ABSENT = (Verdict.DEAD, Evidence.PROC_ABSENT)
BOOT_OVER = (Verdict.DEAD, Evidence.BOOT_BOUNDARY)
REUSED = (Verdict.REUSED, Evidence.START_TIME_DIFFERS)
RECREATED = (Verdict.DEAD, Evidence.PID_NAMESPACE_RECREATED)
UNPINNED = (Verdict.UNKNOWN, Evidence.PIDFD_UNAVAILABLE)
ANSWERS = [ALIVE, EXITED, ABSENT, RECREATED, BOOT_OVER, REUSED, UNPINNED]


def probed(answer: tuple[Verdict, Evidence]) -> ProbeResult:
    return ProbeResult(verdict=answer[0], evidence=answer[1], detail="probed")


def body_of(*, attested: bool = False, terminal: bool = False, node: str = NODE) -> dict[str, Any]:
    body = make_registration(attested=attested, node_name=node)
    if terminal:
        body["status"]["conditions"] = [
            {"type": "Released", "status": "True", "reason": "CleanExit", "message": "",
             "lastTransitionTime": "2026-11-30T17:59:00Z"},
        ]  # fmt: skip
    return body


def run(
    body: dict[str, Any],
    answer: tuple[Verdict, Evidence] | None,
    *,
    first_look: FirstLook | None = None,
    now: datetime.datetime = NOW,
    boot_id: str | None = BOOT,
) -> AgentEffects:
    registration = model.parse_registration(body)
    needed = step.probe_needed(registration=registration, node_name=NODE)
    return step.attest(
        key=KEY,
        body=body,
        registration=registration,
        probe=probed(answer) if needed and answer is not None else None,
        attester=ATTESTER,
        boot_id=boot_id,
        host_id=HOST,
        first_look=first_look,
        now=now,
    )


def applied(body: dict[str, Any], effects: AgentEffects) -> dict[str, Any]:
    """`body` after the write's patch landed (its last op sets the attestation)."""
    assert effects.write is not None
    written = copy.deepcopy(body)
    last = effects.write.ops[-1]
    if last["path"] == "/status":
        written["status"] = dict(last["value"])
    else:
        written.setdefault("status", {})["attestation"] = dict(last["value"])
    return written


def written(effects: AgentEffects) -> tuple[str, str] | None:
    if effects.write is None:
        return None
    return effects.write.attestation["verdict"], effects.write.attestation["evidence"]


# --- the table -------------------------------------------------------------------------------------

LOOK = FirstLook(look="absent", at=NOW - 11 * SECOND)
RECENT = FirstLook(look="absent", at=NOW - 3 * SECOND)
BOOT_LOOK = FirstLook(look="boot-over", at=NOW - 11 * SECOND)


@pytest.mark.parametrize(
    ("answer", "first_look", "boot_id", "write", "requeue_at", "remembered"),
    [
        pytest.param(ALIVE, None, BOOT, ("Alive", "PidfdPinned"), None, None, id="alive: written, nothing remembered"),
        pytest.param(ALIVE, LOOK, BOOT, ("Alive", "PidfdPinned"), None, None, id="alive after a look: starts over"),
        pytest.param(EXITED, None, BOOT, ("Dead", "PidfdExited"), None, None, id="pidfd death: at once"),
        pytest.param(UNPINNED, LOOK, BOOT, ("Unknown", "PidfdUnavailable"), None, None, id="unknown: starts over"),
        pytest.param(
            ABSENT,
            None,
            BOOT,
            None,
            NOW + 10 * SECOND,
            FirstLook(look="absent", at=NOW),
            id="first absence: remembered, back when the window ends",
        ),
        pytest.param(ABSENT, RECENT, BOOT, None, RECENT.at + 10 * SECOND, RECENT, id="absence inside the window: wait"),
        pytest.param(ABSENT, LOOK, BOOT, ("Dead", "ProcAbsent"), None, LOOK, id="absence seen again: written"),
        pytest.param(
            BOOT_OVER,
            LOOK,
            BOOT,
            None,
            NOW + 10 * SECOND,
            FirstLook(look="boot-over", at=NOW),
            id="a boot boundary is another look than an absence",
        ),
        pytest.param(BOOT_OVER, BOOT_LOOK, BOOT, ("Dead", "BootBoundary"), None, BOOT_LOOK, id="boot over twice"),
        pytest.param(
            REUSED,
            None,
            BOOT,
            ("Reused", "StartTimeDiffers"),
            None,
            FirstLook(look="absent", at=NOW),
            id="reused: written, and the first look at the absence",
        ),
        pytest.param(REUSED, LOOK, BOOT, ("Reused", "StartTimeDiffers"), None, LOOK, id="reused keeps the look"),
        pytest.param(
            RECREATED,
            None,
            BOOT,
            None,
            NOW + 10 * SECOND,
            FirstLook(look="absent", at=NOW),
            id="a recreated namespace, first seen: remembered, back when the window ends",
        ),
        pytest.param(
            RECREATED,
            LOOK,
            BOOT,
            ("Dead", "PidNamespaceRecreated"),
            None,
            LOOK,
            id="a recreated namespace after a Reused or absent look: written",
        ),
        pytest.param(
            ABSENT,
            LOOK,
            None,
            ("Unknown", "BootIdUnreadable"),
            None,
            None,
            id="no boot id: Unknown whatever the probe said",
        ),
    ],
)
def test_one_look_at_an_active_registration(
    answer: tuple[Verdict, Evidence],
    first_look: FirstLook | None,
    boot_id: str | None,
    write: tuple[str, str] | None,
    requeue_at: datetime.datetime | None,
    remembered: FirstLook | None,
) -> None:
    effects = run(body_of(), answer, first_look=first_look, boot_id=boot_id)
    assert written(effects) == write
    assert effects.requeue_at == requeue_at
    assert effects.first_look == remembered
    assert not effects.release


def test_a_confirmed_absence_records_both_looks() -> None:
    effects = run(body_of(), ABSENT, first_look=LOOK)
    assert effects.write is not None
    attestation = effects.write.attestation
    assert model.parse_time(attestation["firstObservedTime"]) == LOOK.at
    assert model.parse_time(attestation["observedTime"]) == NOW


def test_a_terminal_registration_is_released_and_never_written() -> None:
    effects = run(body_of(terminal=True), None, first_look=LOOK)
    assert effects == AgentEffects(key=KEY, release=True)


def test_another_nodes_registration_is_unknown_and_never_probed() -> None:
    body = body_of(node="node-b")
    assert not step.probe_needed(registration=model.parse_registration(body), node_name=NODE)
    assert written(run(body, None)) == ("Unknown", "ForeignNode")


def test_an_active_registration_of_this_node_needs_its_probe() -> None:
    registration = model.parse_registration(body_of())
    with pytest.raises(ValueError):
        step.attest(
            key=KEY, body=body_of(), registration=registration, probe=None, attester=ATTESTER, boot_id=BOOT,
            host_id=HOST, first_look=None, now=NOW,
        )  # fmt: skip


def test_the_patch_pins_the_heartbeat_seen_and_the_uid() -> None:
    effects = run(body_of(), EXITED)
    assert effects.write is not None
    tests = [(op["path"], op["value"]) for op in effects.write.ops if op["op"] == "test"]
    body = body_of()
    assert tests == [
        ("/status/lastHeartbeatTime", body["status"]["lastHeartbeatTime"]),
        ("/metadata/uid", body["metadata"]["uid"]),
    ]


# --- properties ------------------------------------------------------------------------------------

answers = st.sampled_from(ANSWERS)
looks = st.none() | st.builds(
    FirstLook,
    look=st.sampled_from(["absent", "boot-over"]),
    at=st.integers(min_value=-30_000, max_value=0).map(lambda ms: NOW + datetime.timedelta(milliseconds=ms)),
)
stored = st.none() | st.tuples(answers, looks)


def _stored_body(previous: tuple[tuple[Verdict, Evidence], FirstLook | None] | None, node: str) -> dict[str, Any]:
    """A registration as an earlier look of this agent may have left it."""
    body = body_of(node=node)
    if previous is not None:
        earlier = run(body, previous[0], first_look=previous[1], now=NOW - 20 * SECOND)
        if earlier.write is not None:
            body = applied(body, earlier)
    return body


@settings(max_examples=400, deadline=None)
@given(answer=answers, first_look=looks, previous=stored, foreign=st.booleans(), boot_readable=st.booleans())
def test_dead_is_written_only_for_the_death_the_probe_confirmed(
    answer: tuple[Verdict, Evidence],
    first_look: FirstLook | None,
    previous: tuple[tuple[Verdict, Evidence], FirstLook | None] | None,
    foreign: bool,
    boot_readable: bool,
) -> None:
    body = _stored_body(previous, "node-b" if foreign else NODE)
    effects = run(body, answer, first_look=first_look, boot_id=BOOT if boot_readable else None)
    if effects.write is None or effects.write.attestation["verdict"] != Verdict.DEAD.value:
        return
    attestation = effects.write.attestation
    registration = model.parse_registration(body)
    assert not foreign and boot_readable
    assert (Verdict.DEAD, Evidence(attestation["evidence"])) == answer, "exactly what the probe found"
    assert attestation["incarnation"] == model.render_incarnation(registration.incarnation)
    assert attestation["bootId"] == BOOT and attestation["agent"]["nodeName"] == NODE
    if attestation["evidence"] in step.CONFIRMED_EVIDENCE:
        first = model.parse_time(attestation["firstObservedTime"])
        last = model.parse_time(attestation["observedTime"])
        assert first is not None and last is not None
        assert (last - first).total_seconds() >= WINDOW, "seen twice, the window apart"


@settings(max_examples=300, deadline=None)
@given(answer=answers, first_look=looks, later=st.integers(min_value=0, max_value=60_000))
def test_no_write_when_the_stored_attestation_already_says_it(
    answer: tuple[Verdict, Evidence], first_look: FirstLook | None, later: int
) -> None:
    body = body_of()
    effects = run(body, answer, first_look=first_look)
    if effects.write is None:
        return
    again = run(
        applied(body, effects), answer, first_look=effects.first_look, now=NOW + datetime.timedelta(milliseconds=later)
    )
    assert again.write is None, "the same verdict is never written twice, however much later"


@settings(max_examples=200, deadline=None)
@given(answer=st.none() | answers, first_look=looks, attested=st.booleans())
def test_a_terminal_registration_is_never_written(
    answer: tuple[Verdict, Evidence] | None, first_look: FirstLook | None, attested: bool
) -> None:
    effects = run(body_of(terminal=True, attested=attested), answer, first_look=first_look)
    assert effects.write is None and effects.release and effects.first_look is None and effects.requeue_at is None


@settings(max_examples=200, deadline=None)
@given(answer=answers, first_look=looks)
def test_a_requeue_is_asked_only_for_an_unconfirmed_absence_and_never_in_the_past(
    answer: tuple[Verdict, Evidence], first_look: FirstLook | None
) -> None:
    effects = run(body_of(), answer, first_look=first_look)
    if effects.requeue_at is not None:
        assert effects.write is None and answer in (ABSENT, RECREATED, BOOT_OVER)
        assert effects.requeue_at > NOW
        assert effects.first_look is not None
        assert effects.requeue_at == effects.first_look.at + datetime.timedelta(seconds=WINDOW)


# --- a clean exit waits for its goodbye ---------------------------------------------------------------

GRACE = step.RELEASE_GRACE_SECONDS
POLL = datetime.timedelta(seconds=step.REAP_POLL_SECONDS)


def exited(how: Exit | None) -> ProbeResult:
    return ProbeResult(verdict=Verdict.DEAD, evidence=Evidence.PIDFD_EXITED, detail="probed", exit=how)


def attest_exit(how: Exit | None, *, first_look: FirstLook | None, now: datetime.datetime) -> AgentEffects:
    body = body_of()
    return step.attest(
        key=KEY,
        body=body,
        registration=model.parse_registration(body),
        probe=exited(how),
        attester=ATTESTER,
        boot_id=BOOT,
        host_id=HOST,
        first_look=first_look,
        now=now,
    )


CLEAN = Exit(Ending.CLEAN, 0)
TERMINATED = Exit(Ending.CLEAN, 15)
KILLED = Exit(Ending.UNCLEAN, 9)
FAILED = Exit(Ending.UNCLEAN, 1 << 8)
UNREAPED = Exit(Ending.UNREAPED)
UNSAID = Exit(Ending.UNKNOWN)
CLEAN_LOOK = FirstLook(look="clean-exit", at=NOW - 2 * SECOND)
REAP_LOOK = FirstLook(look="unreaped", at=NOW - SECOND)


@pytest.mark.parametrize(
    ("how", "first_look", "now", "requeue_at", "remembered"),
    [
        pytest.param(KILLED, None, NOW, None, None, id="killed: Dead at once"),
        pytest.param(FAILED, None, NOW, None, None, id="exit status 1: Dead at once"),
        pytest.param(UNSAID, None, NOW, None, None, id="the kernel cannot say: Dead at once, never held"),
        pytest.param(None, None, NOW, None, None, id="not read: Dead at once"),
        pytest.param(CLEAN, None, NOW, NOW + GRACE * SECOND, FirstLook(look="clean-exit", at=NOW), id="exit 0: held"),
        pytest.param(
            TERMINATED, None, NOW, NOW + GRACE * SECOND, FirstLook(look="clean-exit", at=NOW), id="SIGTERM: held"
        ),
        pytest.param(CLEAN, CLEAN_LOOK, NOW, CLEAN_LOOK.at + GRACE * SECOND, CLEAN_LOOK, id="held from the first look"),
        pytest.param(CLEAN, CLEAN_LOOK, CLEAN_LOOK.at + GRACE * SECOND, None, None, id="grace over: Dead"),
        pytest.param(
            UNREAPED, None, NOW, NOW + POLL, FirstLook(look="unreaped", at=NOW), id="unreaped: read again soon"
        ),
        pytest.param(UNREAPED, REAP_LOOK, NOW, NOW + POLL, REAP_LOOK, id="unreaped: the reap window runs on"),
        pytest.param(
            UNREAPED, REAP_LOOK, REAP_LOOK.at + 2 * SECOND, None, None, id="never reaped: Dead at the window's end"
        ),
        pytest.param(
            CLEAN, REAP_LOOK, NOW, NOW + GRACE * SECOND, FirstLook(look="clean-exit", at=NOW), id="reaped clean: grace"
        ),
        pytest.param(KILLED, CLEAN_LOOK, NOW, None, None, id="unclean after any look: Dead at once"),
    ],
)
def test_a_clean_exit_is_held_for_its_goodbye_and_nothing_else_is(
    how: Exit | None,
    first_look: FirstLook | None,
    now: datetime.datetime,
    requeue_at: datetime.datetime | None,
    remembered: FirstLook | None,
) -> None:
    effects = attest_exit(how, first_look=first_look, now=now)
    if requeue_at is None:
        assert written(effects) == ("Dead", "PidfdExited")
    else:
        assert effects.write is None and effects.requeue_at == requeue_at and effects.first_look == remembered


@given(
    how=st.sampled_from([CLEAN, TERMINATED, KILLED, FAILED, UNREAPED, UNSAID, None]),
    looks=st.lists(st.floats(min_value=0.0, max_value=3.0, allow_nan=False), min_size=1, max_size=40),
)
def test_an_exit_is_written_dead_within_the_reap_window_and_the_grace(how: Exit | None, looks: list[float]) -> None:
    """However often it is looked at, an exit is never held past the reap window plus the grace: the
    hold delays a Dead, it never replaces it."""
    bound = datetime.timedelta(seconds=exits.REAP_WAIT_SECONDS + GRACE)
    now, first_look = NOW, None
    for gap in [*looks, bound.total_seconds()]:
        effects = attest_exit(how, first_look=first_look, now=now)
        if effects.write is not None:
            assert written(effects) == ("Dead", "PidfdExited")
            return
        assert effects.requeue_at is not None and now < effects.requeue_at <= NOW + bound
        first_look = effects.first_look
        now += datetime.timedelta(seconds=gap)
    effects = attest_exit(how, first_look=first_look, now=NOW + bound)
    assert written(effects) == ("Dead", "PidfdExited")
