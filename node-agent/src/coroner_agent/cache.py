"""This node's registrations as the agent last saw them, and the first looks awaiting confirmation.

Fed by the watch (`coroner_agent.inputs`) and by the agent's own writes (the executor keeps the
answer of a write, which is newer than the watch's copy). Each change is noted for the shutdown
wait (`coroner_agent.drain`), which re-reads only what changed (`changed`, `dirty`).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import Any, cast

from coroner.core.model import Key
from coroner.core.world import shared, trimmed
from coroner_agent.effects import FirstLook


class AgentCache:
    def __init__(self, *, release: Callable[[Key], None]) -> None:
        self.bodies: dict[Key, dict[str, Any]] = {}
        self.looks: dict[Key, FirstLook] = {}
        """Deaths read from /proc awaiting their confirming look (`coroner_agent.step`)."""
        self._release = release
        self.changed = asyncio.Event()
        """Set whenever a registration body changes or goes: what the shutdown wait waits on."""
        self.dirty: set[Key] | None = None
        """During the shutdown wait: the keys changed since it last looked (None: not waiting)."""

    def observe(self, key: Key, body: dict[str, Any]) -> None:
        # Only what is read (`trimmed`: whatever a registration carries, a cached one costs a few KB),
        # built from shared strings: ~4 KB a body instead of ~10 KB as decoded (1,000 workers: ~6 MB).
        self.bodies[key] = cast(dict[str, Any], shared(trimmed(body), sys.intern))
        self.touched(key)

    def forget(self, key: Key) -> None:
        """`key` is gone (deleted): its body, its first look and its pins."""
        self.bodies.pop(key, None)
        self.looks.pop(key, None)
        self._release(key)
        self.touched(key)

    def note_look(self, key: Key, look: FirstLook | None) -> None:
        if look is None:
            self.looks.pop(key, None)
        else:
            self.looks[key] = look

    def touched(self, *keys: Key) -> None:
        if self.dirty is not None:
            self.dirty.update(keys)
        self.changed.set()
