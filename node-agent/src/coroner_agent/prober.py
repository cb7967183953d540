"""The agent's Prober: the real probes of `coroner_agent.probe`, keyed by registration.

It owns the reader, the pid index and the pidfd watcher, maps registrations to the incarnations
they record (several registrations may name one incarnation; its pidfd lives while any does), and
re-reads the node facts (boot id, host id, pid namespace visibility) on every rescan.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Callable

from coroner import model, procfs
from coroner.procfs import IncarnationKey, ParseError
from coroner_agent import probe as probes
from coroner_agent.service import Key, Outcome

logger = logging.getLogger("coroner.agent")


class ProcProber:
    """Implements `coroner_agent.service.Prober` against a real /proc."""

    def __init__(
        self,
        *,
        node_name: str,
        proc_root: str,
        boot_id_file: str,
        machine_id_file: str,
        loop: asyncio.AbstractEventLoop,
        on_exit: Callable[[Key], None],
        use_pidfd: bool = True,
        max_pidfds: int = 20000,
    ) -> None:
        self.node_name = node_name
        self.boot_id_file = boot_id_file
        self.machine_id_file = machine_id_file
        self.reader = probes.HostProcReader(proc_root=proc_root)
        self.index = probes.PidIndex()
        self._on_exit = on_exit
        # Without pidfds nothing is pinned: every verdict comes from /proc on resync (benchmarks
        # compare the two paths). A table with no room pins nothing and never guesses.
        self.pidfds: probes.PidfdTable = (
            probes.PidfdWatcher(loop=loop, on_exit=self._fired, max_pinned=max_pidfds)
            if use_pidfd
            else probes.PidfdTable(max_pinned=0)
        )
        self._registrations: dict[IncarnationKey, set[Key]] = defaultdict(set)
        self._incarnation_of: dict[Key, IncarnationKey] = {}
        self.node = self._read_node()

    def _read_node(self) -> probes.NodeFacts:
        return probes.NodeFacts.read(
            node_name=self.node_name,
            reader=self.reader,
            boot_id_file=self.boot_id_file,
            machine_id_file=self.machine_id_file,
        )

    @property
    def in_root_pid_namespace(self) -> bool:
        return self.node.sees_every_process

    def boot_id(self) -> str | None:
        return self.node.boot_id

    def host_id(self) -> str:
        return self.node.host_id

    def rescan(self) -> None:
        """Fresh node facts and an index refresh (one listing of the proc root)."""
        node = self._read_node()
        if node.boot_id != self.node.boot_id:
            logger.warning("boot id changed node=%s from=%s to=%s", self.node_name, self.node.boot_id, node.boot_id)
        self.node = node
        try:
            self.index.refresh(reader=self.reader, proc_pid_namespace=node.proc_pid_namespace)
        except OSError as exc:
            logger.warning("cannot list the proc root node=%s error=%s", self.node_name, exc)

    def probe(self, *, key: Key, registration: model.Registration) -> Outcome:
        result = probes.probe(
            incarnation=registration.incarnation,
            registration_node=registration.node_name,
            node=self.node,
            reader=self.reader,
            index=self.index,
            pidfds=self.pidfds,
        )
        self._remember(key, registration.incarnation)
        return Outcome(verdict=result.verdict, evidence=result.evidence, detail=result.detail)

    def _remember(self, key: Key, incarnation: model.Incarnation) -> None:
        try:
            recorded = procfs.recorded_incarnation(
                boot_id=incarnation.boot_id,
                pid_namespace=incarnation.pid_namespace,
                pid=incarnation.pid,
                start_time=incarnation.start_time,
            )
        except ParseError:
            return
        previous = self._incarnation_of.get(key)
        if previous is not None and previous != recorded:
            self._detach(key, previous)
        self._incarnation_of[key] = recorded
        self._registrations[recorded].add(key)

    def forget(self, *, key: Key) -> None:
        previous = self._incarnation_of.pop(key, None)
        if previous is not None:
            self._detach(key, previous)

    def _detach(self, key: Key, incarnation: IncarnationKey) -> None:
        keys = self._registrations.get(incarnation)
        if keys is None:
            return
        keys.discard(key)
        if not keys:
            del self._registrations[incarnation]
            self.pidfds.release(incarnation)  # no registration names it any more: close its pidfd

    def _fired(self, incarnation: IncarnationKey) -> None:
        for key in sorted(self._registrations.get(incarnation, ())):
            self._on_exit(key)

    def close(self) -> None:
        self.pidfds.close()
