"""Faults of what every trial shares: the operator (killed, doubled), the API server (restarted, watches\nexpired), the retire grant, and 500 deaths at once."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from faults.catalogue.base import Fault, fault
from faults.workers import Worker

if TYPE_CHECKING:
    pass


@fault("operator_sigkill")
class OperatorSigkill(Fault):
    """SIGKILL the operator in the middle of a burst of retirements, then start a new one."""

    cluster_wide = True

    def plan(self) -> None:
        self.variant = self.pick(["at-first-retirement", "random-delay"])
        for i in range(self.rng.randint(6, 12)):
            self.trial.add(self.trial.rng.choice(self.trial.nodes), "sleep", victim=True, tag=f"burst{i}")

    def after(self) -> None:
        plane = self.trial.plane
        log = plane.operator.log
        if self.variant == "at-first-retirement":
            needle = f"retired workerregistration={self.trial.namespace}/"
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and needle not in log.read_text(errors="replace"):
                time.sleep(0.005)
        else:
            time.sleep(self.rng.uniform(0.0, 0.6))
        plane.kill_operator()
        self.trial.note("operator SIGKILLed")
        time.sleep(self.rng.uniform(0.0, 2.0))
        plane.start_operator()


@fault("two_operators")
class TwoOperators(Fault):
    """A second operator replica racing the first over a burst of deaths."""

    cluster_wide = True

    def plan(self) -> None:
        for i in range(self.rng.randint(8, 16)):
            self.trial.add(self.trial.rng.choice(self.trial.nodes), "sleep", victim=True, tag=f"burst{i}")

    def arm(self) -> None:
        self.second = self.trial.plane.start_operator()
        deadline = time.monotonic() + 60
        while "operator started" not in self.second.log.read_text(errors="replace"):
            if time.monotonic() > deadline:
                self.failures.append("the second operator did not start")
                return
            time.sleep(0.05)
        time.sleep(1.0)  # its watches are listed once its startup handler has run

    def heal(self) -> None:
        self.trial.plane.ensure_one_operator()

    def verify(self) -> None:
        text = "".join(p.read_text(errors="replace") for p in self.trial.plane.operator_logs[-2:])
        self.facts["cas_conflicts"] = text.count(f"retire conflict workerregistration={self.trial.namespace}/")


@fault("leader_kill")
class LeaderKill(Fault):
    """Two replicas with leader election, as the manifests run them; SIGKILL the leader in the middle
    of a burst of deaths. The standby leads once the Lease expires and retires what is left; anything
    the killed leader wrote is fenced by the resourceVersion test like any other writer's."""

    cluster_wide = True

    def plan(self) -> None:
        self.variant = self.pick(["at-first-retirement", "random-delay"])
        for i in range(self.rng.randint(6, 12)):
            self.trial.add(self.trial.rng.choice(self.trial.nodes), "sleep", victim=True, tag=f"burst{i}")

    def arm(self) -> None:
        self.pair = self.trial.plane.replace_operators(2, leader_elect=True)
        deadline = time.monotonic() + 60
        while not any(o.leads for o in self.pair):
            if time.monotonic() > deadline:
                self.failures.append("neither replica led within 60 s")
                return
            time.sleep(0.05)
        time.sleep(1.0)  # the leader's watches are listed once it leads

    def after(self) -> None:
        leader = next((o for o in self.pair if o.leads), None)
        if leader is None:
            self.failures.append("no replica led when the leader was to be killed")
            return
        if self.variant == "at-first-retirement":
            needle = f"retired workerregistration={self.trial.namespace}/"
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and needle not in leader.log.read_text(errors="replace"):
                time.sleep(0.005)
        else:
            time.sleep(self.rng.uniform(0.0, 0.6))
        leader.kill()
        killed_at = time.monotonic()
        self.trial.note(f"leader {leader.identity} SIGKILLed")
        standby = next(o for o in self.pair if o is not leader)
        while not standby.leads and time.monotonic() - killed_at < 60:
            time.sleep(0.05)
        self.facts["takeover_seconds"] = round(time.monotonic() - killed_at, 2)
        if not standby.leads:
            self.failures.append(f"the standby {standby.identity} did not lead within 60 s of the leader's SIGKILL")

    def heal(self) -> None:
        self.trial.plane.replace_operators(1, leader_elect=False)


@fault("apiserver_restart")
class ApiserverRestart(Fault):
    """The kube-apiserver stopped (SIGTERM or a crash) and started again on the same port, right
    after the deaths (retirements race the outage) or before them (the outage is over first)."""

    cluster_wide = True
    shared_round = True
    variants = ("graceful", "crash", "graceful-before-deaths", "crash-before-deaths")

    def plan(self) -> None:
        self.variant = self.pick(list(self.variants))

    def _restart(self) -> None:
        # In a shared round, every trial of the round reaches this point, then one restart serves all.
        graceful = self.variant.startswith("graceful")
        down = self.trial.together(
            "apiserver_restart", None, lambda _: self.trial.plane.restart_apiserver(graceful=graceful)
        )
        self.facts["seconds"] = round(down, 2)
        self.trial.note(f"kube-apiserver restarted in {down:.1f} s")

    def arm(self) -> None:
        if self.variant.endswith("before-deaths"):
            self._restart()
            time.sleep(3.0)  # clients reconnect and the new server settles before anyone dies

    def after(self) -> None:
        if not self.variant.endswith("before-deaths"):
            self._restart()


@fault("watch_expiry")
class WatchExpiry(Fault):
    """Watches resumed from a resourceVersion the API server no longer has: 410 Gone.

    Every component's proxy blackholes its connections while the API server restarts (its watch
    cache starts afresh, at a newer resourceVersion), workers die meanwhile, then each in-flight watch
    is ended cleanly, as the server's timeoutSeconds would end it: the components resume from the
    last resourceVersion they saw and the real API server answers 410 (counted by the proxies).
    """

    cluster_wide = True
    shared_round = True
    variants = ("graceful", "crash")

    def plan(self) -> None:
        self.variant = self.pick(list(self.variants))
        self.outage = [
            self.trial.add(
                self.trial.rng.choice(self.trial.nodes), "sleep", victim=True, tag=f"outage{i}", generic=False
            )
            for i in range(2)
        ]

    def after(self) -> None:
        # In a shared round: one outage for every trial of the round, with each one's deaths in it.
        self.facts = dict(self.trial.together("watch_expiry", self._deaths, self._expire))

    def _expire(self, deaths: list[Any]) -> dict[str, Any]:
        plane = self.trial.plane
        proxies = [a.proxy for a in plane.agents.values()] + [plane.operator_proxy]
        before = {p.name: p.snapshot() for p in proxies}
        modes = {p.name: p.mode for p in proxies}  # a partitioned agent stays partitioned
        for p in proxies:
            p.set_mode("stall")
        time.sleep(0.3)
        down = plane.restart_apiserver(graceful=self.variant == "graceful", during=lambda: [d() for d in deaths])
        time.sleep(2.0)  # the new server settles (its storage initializes) before clients resume
        ended = sum(p.end_watches() for p in proxies)
        for p in proxies:
            p.set_mode(modes[p.name])
        self.trial.note(f"watches ended cleanly: {ended}; API server down {down:.1f} s")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            gone = {p.name: p.snapshot().get("gone_410", 0) - before[p.name].get("gone_410", 0) for p in proxies}
            if gone.get("operator", 0) > 0 and sum(gone.values()) > gone.get("operator", 0):
                break
            time.sleep(0.2)
        return {"watches_ended": ended, "gone_410": gone, "seconds": round(down, 2)}

    def _deaths(self) -> None:
        for w in self.outage:
            w.kill()

    def verify(self) -> None:
        gone = self.facts.get("gone_410", {})
        if not gone.get("operator"):
            self.failures.append(f"the operator never received a 410 (proxies saw {gone})")
        if not any(v for k, v in gone.items() if k != "operator"):
            self.failures.append(f"no agent received a 410 (proxies saw {gone})")


@fault("grant_revoked")
class GrantRevoked(Fault):
    """kubectl delete clusterrolebinding coroner-operator-retire, mid-run; restored at the heal."""

    cluster_wide = True

    hold = 2.0

    def arm(self) -> None:
        plane = self.trial.plane
        plane.revoke_grant()
        deadline = time.monotonic() + 15
        while plane.retry(lambda: plane.operator_may_retire(self.trial.namespace)):
            if time.monotonic() > deadline:
                self.failures.append("the revocation did not take effect")
                break
            time.sleep(0.1)
        self.trial.grant_revoked = (time.time(), None)

    def blocked(self, w: Worker) -> frozenset[str] | None:
        return frozenset({"RetirePermissionMissing"})

    def heal(self) -> None:
        revoked_at = self.trial.grant_revoked[0] if self.trial.grant_revoked else time.time()
        self.trial.grant_revoked = (revoked_at, time.time())
        self.trial.plane.restore_grant()


@fault("mass_death")
class MassDeath(Fault):
    """500 workers (real `sleep` processes) SIGKILLed within one second."""

    cluster_wide = True

    def plan(self) -> None:
        self.count = self.trial.mass_count
        self.victims = [
            self.trial.add(
                self.trial.nodes[i % len(self.trial.nodes)],
                "sleep",
                victim=True,
                tag=f"mass{i}",
                generic=False,
                interval=10,
                ttl=30,
                heartbeating=False,
            )
            for i in range(self.count)
        ]

    def strike(self) -> None:
        started = time.time()
        for w in self.victims:
            w.kill(reap=False)
        spread = time.time() - started
        for w in self.victims:
            w.reap()
        self.facts["kill_spread_seconds"] = round(spread, 3)
        if spread > 1.0:
            self.failures.append(f"the kills took {spread:.2f} s, not under one second")

    def verify(self) -> None:
        lat = sorted(
            w.retired_seen_at - w.killed_at  # type: ignore[operator]
            for w in self.victims
            if w.retired_seen_at is not None and w.killed_at is not None
        )
        if lat:
            self.facts["retired"] = len(lat)
            self.facts["p50_s"] = round(lat[len(lat) // 2], 2)
            self.facts["max_s"] = round(lat[-1], 2)
