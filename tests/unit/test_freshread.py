"""FreshRead: a caller shares a read only if it was sent after the caller decided; at most two live per key."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coroner_operator.freshread import FreshRead

pytestmark = pytest.mark.unit


class Reads:
    """A fetch whose answer is the clock reading at which it was sent, completed by the test."""

    def __init__(self) -> None:
        self.now = 0.0
        self.pending: list[asyncio.Future[float]] = []
        self.sent: list[tuple[str, float]] = []
        self.in_flight: dict[str, int] = {}
        self.most_in_flight = 0

    def clock(self) -> float:
        return self.now

    async def fetch(self, key: str) -> float:
        sent_at = self.now
        self.sent.append((key, sent_at))
        self.in_flight[key] = self.in_flight.get(key, 0) + 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight[key])
        gate: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.pending.append(gate)
        try:
            await gate
        finally:
            self.in_flight[key] -= 1
        return sent_at

    def complete_oldest(self) -> None:
        gate = self.pending.pop(0)
        gate.set_result(0.0)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_callers_decided_before_the_read_share_it_later_ones_wait_for_the_next() -> None:
    async def scenario() -> None:
        reads = Reads()
        fresh: FreshRead[str, float] = FreshRead(reads.fetch, clock=reads.clock)
        reads.now = 10.0
        first = asyncio.ensure_future(fresh.get("ns", decided_at=9.0))
        await settle()
        second = asyncio.ensure_future(fresh.get("ns", decided_at=10.0))  # decided at the send: shares
        other = asyncio.ensure_future(fresh.get("other", decided_at=10.0))  # another key: its own
        await settle()
        reads.now = 11.0
        third = asyncio.ensure_future(fresh.get("ns", decided_at=10.5))  # decided after the send
        fourth = asyncio.ensure_future(fresh.get("ns", decided_at=10.9))
        await settle()
        assert [k for k, _ in reads.sent] == ["ns", "other"], "one read in flight per key"
        reads.now = 12.0
        reads.complete_oldest()  # the first "ns" read: the next starts at once, for third and fourth
        await settle()
        assert reads.sent[-1] == ("ns", 12.0)
        assert fresh.requests == 3
        while reads.pending:
            reads.complete_oldest()
            await settle()
        assert (await first, await second, await other) == (10.0, 10.0, 10.0)
        assert (await third, await fourth) == (12.0, 12.0)

    asyncio.run(scenario())


def test_a_finished_read_is_never_reused() -> None:
    async def scenario() -> None:
        reads = Reads()
        fresh: FreshRead[str, float] = FreshRead(reads.fetch, clock=reads.clock)
        task = asyncio.ensure_future(fresh.get("ns", decided_at=0.0))
        await settle()
        reads.complete_oldest()
        assert await task == 0.0
        again = asyncio.ensure_future(fresh.get("ns", decided_at=0.0))
        await settle()
        assert fresh.requests == 2, "a result already fetched answers nobody who asks afterwards"
        reads.complete_oldest()
        await again

    asyncio.run(scenario())


def test_an_error_reaches_every_sharer_and_a_cancelled_caller_does_not_cancel_the_read() -> None:
    async def scenario() -> None:
        gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def failing(_key: str) -> bool:
            await gate
            raise ConnectionResetError("reset")

        fresh: FreshRead[str, bool] = FreshRead(failing, clock=lambda: 1.0)
        a = asyncio.ensure_future(fresh.get("ns", decided_at=0.0))
        b = asyncio.ensure_future(fresh.get("ns", decided_at=0.0))
        c = asyncio.ensure_future(fresh.get("ns", decided_at=0.0))
        await settle()
        a.cancel()
        await settle()
        gate.set_result(None)
        for task in (b, c):
            with pytest.raises(ConnectionResetError):
                await task
        assert a.cancelled()
        assert fresh.requests == 1

    asyncio.run(scenario())


def test_a_failed_read_fails_its_sharers_only_the_queued_callers_get_the_next_read() -> None:
    async def scenario() -> None:
        answers = iter([ConnectionResetError("reset"), True])
        gates: list[asyncio.Future[None]] = []

        async def fetch(_key: str) -> bool:
            gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            gates.append(gate)
            await gate
            answer = next(answers)
            if isinstance(answer, Exception):
                raise answer
            return answer

        now = [1.0]
        fresh: FreshRead[str, bool] = FreshRead(fetch, clock=lambda: now[0])
        sharer = asyncio.ensure_future(fresh.get("ns", decided_at=0.5))
        await settle()
        now[0] = 2.0
        queued = asyncio.ensure_future(fresh.get("ns", decided_at=1.5))
        await settle()
        gates[0].set_result(None)
        await settle()
        with pytest.raises(ConnectionResetError):
            await sharer
        gates[1].set_result(None)
        assert await queued is True
        assert fresh.requests == 2

    asyncio.run(scenario())


actions = st.lists(
    st.one_of(
        st.tuples(st.just("call"), st.sampled_from(["a", "b"]), st.floats(0.0, 3.0)),
        st.tuples(st.just("advance"), st.just(""), st.floats(0.0, 2.0)),
        st.tuples(st.just("complete"), st.just(""), st.just(0.0)),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(actions)
def test_every_answer_was_sent_no_earlier_than_its_callers_decision(steps: list[tuple[str, str, float]]) -> None:
    async def scenario() -> None:
        reads = Reads()
        fresh: FreshRead[str, float] = FreshRead(reads.fetch, clock=reads.clock)
        calls: list[tuple[float, asyncio.Future[float]]] = []
        for action, key, amount in steps:
            if action == "call":
                decided_at = reads.now - amount  # decided `amount` ago
                calls.append((decided_at, asyncio.ensure_future(fresh.get(key, decided_at=decided_at))))
            elif action == "advance":
                reads.now += amount
            elif reads.pending:
                reads.complete_oldest()
            await settle()
        while reads.pending:
            reads.complete_oldest()
            await settle()
        for decided_at, call in calls:
            assert await call >= decided_at
        assert fresh.requests == len(reads.sent) <= len(calls)
        assert reads.most_in_flight <= 2

    asyncio.run(scenario())


def test_the_next_read_waits_until_every_holder_of_the_last_one_released_it() -> None:
    """Group commit, write phase included: callers holding a read's result (their retirement writes
    in progress) keep the next read of the key unsent, so every decision made meanwhile joins one
    batch; an isolated caller (nothing held) gets its read at once."""

    async def scenario() -> None:
        reads = Reads()
        fresh: FreshRead[str, float] = FreshRead(reads.fetch, clock=reads.clock)
        released = asyncio.Event()
        answers: list[float] = []

        async def writer(decided_at: float) -> None:
            async with fresh.hold("ns", decided_at=decided_at) as value:
                answers.append(value)
                await released.wait()  # its write, in flight

        reads.now = 1.0
        first = asyncio.ensure_future(writer(0.5))
        await settle()
        reads.complete_oldest()
        await settle()
        assert answers == [1.0], "an isolated caller is answered by one read, sent at once"
        reads.now = 2.0
        late = [asyncio.ensure_future(fresh.get("ns", decided_at=1.5 + i / 10)) for i in range(3)]
        await settle()
        assert len(reads.sent) == 1, "no read is sent while the last one's holders write"
        reads.now = 3.0
        released.set()
        await first
        await settle()
        assert reads.sent == [("ns", 1.0), ("ns", 3.0)], "one read for everything decided meanwhile"
        reads.complete_oldest()
        assert [await t for t in late] == [3.0, 3.0, 3.0]
        assert fresh.requests == 2

    asyncio.run(scenario())


def test_a_lone_caller_overtakes_a_read_in_flight_for_one_other_caller() -> None:
    """The API server answers a consistent read only once its cache caught up, which can take a
    period: a death decided while another death's read waits would wait for that read, its write,
    and then a period of its own. A second read sent at once is answered by the same catch-up. Only
    while the read in flight has one holder, and at most two reads per key: a burst still batches."""

    async def scenario() -> None:
        reads = Reads()
        fresh: FreshRead[str, float] = FreshRead(reads.fetch, clock=reads.clock)
        reads.now = 1.0
        first = asyncio.ensure_future(fresh.get("ns", decided_at=0.5))
        await settle()
        reads.now = 2.0
        second = asyncio.ensure_future(fresh.get("ns", decided_at=1.5))  # decided after the first read was sent
        await settle()
        assert reads.sent == [("ns", 1.0), ("ns", 2.0)], "the lone second caller's read is sent at once"
        reads.now = 3.0
        burst = [asyncio.ensure_future(fresh.get("ns", decided_at=2.5 + i / 10)) for i in range(3)]
        await settle()
        assert len(reads.sent) == 2, "two reads in flight: everything decided meanwhile waits for one more"
        reads.complete_oldest()
        await settle()
        assert len(reads.sent) == 2, "the next read waits until both reads are done"
        reads.now = 4.0
        reads.complete_oldest()
        await settle()
        assert reads.sent[-1] == ("ns", 4.0)
        reads.complete_oldest()
        assert (await first, await second) == (1.0, 2.0)
        assert [await t for t in burst] == [4.0, 4.0, 4.0]
        assert fresh.requests == 3

    asyncio.run(scenario())


def test_a_read_in_flight_for_several_callers_is_not_overtaken() -> None:
    async def scenario() -> None:
        reads = Reads()
        fresh: FreshRead[str, float] = FreshRead(reads.fetch, clock=reads.clock)
        reads.now = 1.0
        batch = [asyncio.ensure_future(fresh.get("ns", decided_at=0.5)) for _ in range(2)]
        await settle()
        reads.now = 2.0
        late = asyncio.ensure_future(fresh.get("ns", decided_at=1.5))
        await settle()
        assert len(reads.sent) == 1, "a batch's read is not overtaken: the late caller waits for the next"
        reads.complete_oldest()
        await settle()
        assert reads.sent[-1] == ("ns", 2.0)
        reads.complete_oldest()
        assert [await t for t in batch] == [1.0, 1.0]
        assert await late == 2.0

    asyncio.run(scenario())
