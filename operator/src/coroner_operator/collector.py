"""Python's cycle collector, paused while registrations are listed into the cache.

A list builds the cache: millions of objects at 150,000 registrations, all of them long-lived. While
it grows, each of the collector's full collections walks the whole heap again (a full collection
comes every time the long-lived objects grew by a quarter): measured, ingesting 150,000
registrations took 172 us each with the collector running against 133 us paused (``kubectl coroner
plan`` pauses it for the same reason). Reference counting still frees whatever is dropped meanwhile.

When the last list in progress ends, the collector runs again, and what exists then is frozen
(`gc.freeze`): the cache holds no reference cycles and lives as long as the process, so later full
collections need not walk it (each would take about a second at 150,000). A frozen object that is
dropped later is still freed by its reference count.
"""

from __future__ import annotations

import gc
from collections.abc import Hashable
from types import ModuleType


class ListingPause:
    """Pauses the collector from the first page of a list until the last list in progress ends."""

    def __init__(self, *, collector: ModuleType = gc) -> None:
        self._gc = collector
        self._listing: set[Hashable] = set()
        self._paused = False

    def begin(self, scope: Hashable) -> None:
        """A list of `scope` started (again: a list that failed midway starts over)."""
        self._listing.add(scope)
        if not self._paused and self._gc.isenabled():  # paused by someone else: theirs to resume
            self._gc.disable()
            self._paused = True

    def end(self, scope: Hashable) -> None:
        """A list of `scope` handed over its last page."""
        self._listing.discard(scope)
        if not self._listing:
            self._resume()

    def close(self) -> None:
        """The watches stopped: no list is in progress any more."""
        self._listing.clear()
        self._resume()

    def _resume(self) -> None:
        if self._paused:
            self._paused = False
            self._gc.enable()
            self._gc.freeze()
