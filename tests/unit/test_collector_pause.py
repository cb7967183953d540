"""The operator pauses the cycle collector while it lists registrations into its cache, and freezes
what the lists built once the last one ended."""

from __future__ import annotations

import types

import pytest

from coroner_operator.collector import ListingPause

pytestmark = pytest.mark.unit


class Collector(types.ModuleType):
    """A stand-in for `gc` that records what was asked of it."""

    def __init__(self, *, enabled: bool = True) -> None:
        super().__init__("gc")
        self.enabled = enabled
        self.calls: list[str] = []

    def isenabled(self) -> bool:
        return self.enabled

    def disable(self) -> None:
        self.enabled = False
        self.calls.append("disable")

    def enable(self) -> None:
        self.enabled = True
        self.calls.append("enable")

    def freeze(self) -> None:
        self.calls.append("freeze")


def test_paused_from_the_first_page_until_the_last_list_ends() -> None:
    collector = Collector()
    pause = ListingPause(collector=collector)
    pause.begin("a")
    pause.begin("b")  # one watch per namespace: lists overlap
    pause.begin("a")  # a list that failed midway starts over
    assert collector.calls == ["disable"]
    pause.end("a")
    assert not collector.enabled, "b is still listing"
    pause.end("b")
    assert collector.calls == ["disable", "enable", "freeze"] and collector.enabled
    pause.begin(None)  # a relist later: paused again
    pause.end(None)
    assert collector.calls == ["disable", "enable", "freeze"] * 2


def test_a_list_cut_short_by_the_watches_stopping_resumes_it() -> None:
    collector = Collector()
    pause = ListingPause(collector=collector)
    pause.begin("a")
    pause.close()
    assert collector.enabled and collector.calls == ["disable", "enable", "freeze"]
    pause.close()
    assert collector.calls == ["disable", "enable", "freeze"], "nothing to resume twice"


def test_a_collector_someone_else_paused_is_left_to_them() -> None:
    collector = Collector(enabled=False)
    pause = ListingPause(collector=collector)
    pause.begin("a")
    pause.end("a")
    assert not collector.enabled and collector.calls == []
