"""The fault catalogue: every fault a trial can inject, one module per family, registered by name.

base        Fault (a fault's part in each phase), the registry FAULTS, @fault
processes   pid_reuse, boot_id_change, zombie
agents      agent_sigkill, agent_sigstop, agent_partition, agent_restart, agent_clock_skew,
            worker_clock_skew
control     operator_sigkill, two_operators, leader_kill, apiserver_restart, watch_expiry,
            grant_revoked, mass_death
writes      heartbeat_race, foreign_attestation, worker_attestation, malformed
sieve       Sieve's three patterns on the real control plane: stale_view, unobserved_state,
            crash_after_write (see docs/faults.md)
selftest    the detectors' self-test (never drawn)
"""

from __future__ import annotations

from faults.catalogue import agents, control, processes, selftest, sieve, writes  # noqa: F401  (registers)
from faults.catalogue.base import AGENT_DOWN, FAULTS, Fault, fault

__all__ = ["AGENT_DOWN", "FAULTS", "Fault", "fault"]
