"""The agent's Prober: the real probes of `coroner_agent.probe`, keyed by registration.

It owns the reader, the pid index and the pidfd watcher, maps registrations to the incarnations
they record (several registrations may name one incarnation; its pidfd lives while any does), and
re-reads the node facts (boot id, host id, pid namespace visibility) on every rescan.

A `Reused` registration (its recorded number is held by another process) also watches that
holder: the probe pins it with a pidfd, within the same budget, and its exit re-probes the
registration at once instead of at the next resync. The holder's exit is only a trigger: the
re-probe decides (typically ProcAbsent, now that the number is free). A holder that exited but is
not reaped yet still holds the number; it is looked at again with a short backoff
(`REUSER_RETRY_SECONDS`, doubling up to `REUSER_RETRY_MAX_SECONDS`), as no event marks a reap.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Callable

from coroner.core import model, procfs
from coroner.core.model import Key
from coroner.core.procfs import IncarnationKey, ParseError
from coroner_agent import probe as probes
from coroner_agent.pidfds import PidfdTable, PidfdWatcher
from coroner_agent.pidindex import PidIndex
from coroner_agent.proc import BOOT_ID_FILE, MACHINE_ID_FILE, HostProcReader, LocalNode, ProcReader
from coroner_agent.verdict import ProbeResult

logger = logging.getLogger("coroner.agent")

#: First re-probe of a Reused registration whose holder exited but is not reaped yet; then doubling.
REUSER_RETRY_SECONDS = 0.05
REUSER_RETRY_MAX_SECONDS = 5.0


class ProcProber:
    """Implements `coroner_agent.reconciler.Prober` against a real /proc.

    Its I/O is three ports, real by default: `reader` (the proc root), `pidfd_table` (given the
    prober's callback for an exited incarnation, the table that pins pidfds and reports their
    readability; default a `PidfdWatcher` on `loop`) and `node_facts` (this node's boot id, host id
    and pid namespaces; default `LocalNode.read` of the files named). The simulation (tests/sim)
    gives its model kernel's; everything else here runs as shipped. `observe`, if given, is shown
    each probe's key and result once the prober has acted on it (the simulation's oracle checks
    every verdict against its kernel's truth)."""

    def __init__(
        self,
        *,
        node_name: str,
        loop: asyncio.AbstractEventLoop,
        on_exit: Callable[[Key], None],
        proc_root: str = "/proc",
        boot_id_file: str = BOOT_ID_FILE,
        machine_id_file: str = MACHINE_ID_FILE,
        use_pidfd: bool = True,
        max_pidfds: int = 20000,
        reader: ProcReader | None = None,
        pidfd_table: Callable[[Callable[[IncarnationKey], None]], PidfdTable] | None = None,
        node_facts: Callable[[], LocalNode] | None = None,
        observe: Callable[[Key, ProbeResult], None] | None = None,
    ) -> None:
        self.node_name = node_name
        self.boot_id_file = boot_id_file
        self.machine_id_file = machine_id_file
        self.reader: ProcReader = reader if reader is not None else HostProcReader(proc_root=proc_root)
        self._node_facts = node_facts if node_facts is not None else self._read_node_files
        self.index = PidIndex()
        self._on_exit = on_exit
        self._observe = observe
        # Without pidfds nothing is pinned: every verdict comes from /proc on resync (benchmarks
        # compare the two paths). A table with no room pins nothing and never guesses.
        if pidfd_table is not None:
            self.pidfds: PidfdTable = pidfd_table(self.fired)
        elif use_pidfd:
            self.pidfds = PidfdWatcher(loop=loop, on_exit=self.fired, max_pinned=max_pidfds)
        else:
            self.pidfds = PidfdTable(max_pinned=0)
        self._loop = loop
        self._registrations: dict[IncarnationKey, set[Key]] = defaultdict(set)
        self._incarnation_of: dict[Key, IncarnationKey] = {}
        # Reused registrations and the process that holds their number (see the module docstring).
        self._watchers: dict[IncarnationKey, set[Key]] = defaultdict(set)
        self._reuser_of: dict[Key, IncarnationKey] = {}
        self._retry_delays: dict[Key, float] = {}
        self._retry_handles: dict[Key, asyncio.TimerHandle] = {}
        self.node = self._node_facts()

    def _read_node_files(self) -> LocalNode:
        return LocalNode.read(
            node_name=self.node_name,
            reader=self.reader,
            boot_id_file=self.boot_id_file,
            machine_id_file=self.machine_id_file,
        )

    @property
    def sees_every_process(self) -> bool:
        return self.node.sees_every_process

    def boot_id(self) -> str | None:
        return self.node.boot_id

    def host_id(self) -> str:
        return self.node.host_id

    def rescan(self) -> None:
        """Fresh node facts and an index refresh (one listing of the proc root)."""
        node = self._node_facts()
        if node.boot_id != self.node.boot_id:
            logger.warning("boot id changed node=%s from=%s to=%s", self.node_name, self.node.boot_id, node.boot_id)
        self.node = node
        try:
            self.index.refresh(reader=self.reader, proc_pid_namespace=node.proc_pid_namespace)
        except OSError as exc:
            logger.warning("cannot list the proc root node=%s error=%s", self.node_name, exc)

    def probe(self, *, key: Key, registration: model.Registration) -> ProbeResult:
        result = probes.probe(
            incarnation=registration.incarnation,
            registration_node=registration.node_name,
            node=self.node,
            reader=self.reader,
            index=self.index,
            pidfds=self.pidfds,
        )
        self._remember(key, registration.incarnation)
        self._watch_reuser(key, result.reuser)
        self._schedule_retry(key, wanted=result.reuser_exited)
        if self._observe is not None:
            self._observe(key, result)
        return result

    def _watch_reuser(self, key: Key, reuser: IncarnationKey | None) -> None:
        previous = self._reuser_of.get(key)
        if previous == reuser:
            return
        if previous is not None:
            del self._reuser_of[key]
            self._detach(key, previous, self._watchers)
        if reuser is not None:
            self._reuser_of[key] = reuser
            self._watchers[reuser].add(key)

    def _schedule_retry(self, key: Key, *, wanted: bool) -> None:
        """Re-probes `key` after a backoff while its number's holder is an exited, unreaped process."""
        handle = self._retry_handles.pop(key, None)
        if handle is not None:
            handle.cancel()
        if not wanted:
            self._retry_delays.pop(key, None)
            return
        previous = self._retry_delays.get(key)
        delay = REUSER_RETRY_SECONDS if previous is None else min(previous * 2, REUSER_RETRY_MAX_SECONDS)
        self._retry_delays[key] = delay
        self._retry_handles[key] = self._loop.call_later(delay, self._retry, key)

    def _retry(self, key: Key) -> None:
        if self._retry_handles.pop(key, None) is not None:
            self._on_exit(key)

    def _remember(self, key: Key, incarnation: model.Incarnation) -> None:
        try:
            recorded = procfs.recorded_incarnation(
                boot_id=incarnation.boot_id,
                pid_namespace=incarnation.pid_namespace,
                pid=incarnation.pid,
                start_time=incarnation.start_time,
                pidfd_inode=incarnation.pidfd_inode,
            )
        except ParseError:
            return
        previous = self._incarnation_of.get(key)
        if previous is not None and previous != recorded:
            self._detach(key, previous, self._registrations)
        self._incarnation_of[key] = recorded
        self._registrations[recorded].add(key)

    def forget(self, *, key: Key) -> None:
        previous = self._incarnation_of.pop(key, None)
        if previous is not None:
            self._detach(key, previous, self._registrations)
        self._watch_reuser(key, None)
        self._schedule_retry(key, wanted=False)

    def _detach(self, key: Key, incarnation: IncarnationKey, by: dict[IncarnationKey, set[Key]]) -> None:
        keys = by.get(incarnation)
        if keys is None:
            return
        keys.discard(key)
        if not keys:
            del by[incarnation]
            if incarnation not in self._registrations and incarnation not in self._watchers:
                self.pidfds.release(incarnation)  # no registration names or watches it any more: close its pidfd

    def fired(self, incarnation: IncarnationKey) -> None:
        """A pinned pidfd became readable: a registration's own incarnation exited, or the holder of
        a Reused registration's number did. Either way the registration is probed again, and only
        that probe decides."""
        keys = self._registrations.get(incarnation, set()) | self._watchers.get(incarnation, set())
        for key in sorted(keys):
            self._on_exit(key)

    def pidfds_held(self) -> int:
        """Pidfds open: pinned incarnations and watched holders of a Reused registration's number."""
        return len(self.pidfds)

    @property
    def watched_reusers(self) -> int:
        """Distinct processes holding a Reused registration's number that the prober watches."""
        return len(self._watchers)

    def close(self) -> None:
        for handle in self._retry_handles.values():
            handle.cancel()
        self._retry_handles.clear()
        self.pidfds.close()
