"""The worker side: register an incarnation once, release it on a clean exit, nothing in between.

`coroner run -- CMD` launches CMD as a child and registers the child's own incarnation, probed from
its /proc entries; `registered()` registers the calling process itself (the Python API). Both
create the WorkerRegistration with a fresh launcher-minted `inst-` clientInstanceId and mark
`Released` with one server-side apply of that condition (see `coroner.core.wire.release_apply`).
Liveness is the node agent's: it pins the incarnation with a pidfd and renews one Lease per node.
A worker that wants a second, worker-side witness opts into heartbeats (``spec.heartbeat``): merge
patches that touch only status.lastHeartbeatTime, every interval.

There is one launcher per worker process, so it speaks to the API with `coroner.client.rest` (as
the agent and the operator do), not the `kubernetes` package, whose import alone costs each worker
tens of MB of memory (see `coroner.client.rest`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import logging
import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import urllib3
import yaml

from coroner import pidfs
from coroner.client.rest import ApiError, Rest, registrations_path, warming_up
from coroner.core import api, kubewire, model, procfs, wire

logger = logging.getLogger("coroner.launcher")

#: The identity's client (Rest) is named in the API server's logs and audit as this user agent.
USER_AGENT = "coroner-launcher"
#: How long registering, and the goodbye, outlast an API server that is busy, unavailable or
#: warming up (`coroner.client.rest.warming_up`) before they fail.
PATIENCE_SECONDS = 30.0

_T = TypeVar("_T")


class RegistrationError(Exception):
    """A registration could not be made; the message names the object and the fix."""


def probe_incarnation(
    pid: int,
    *,
    node_name: str,
    proc_root: str = "/proc",
    boot_id_file: str = "/proc/sys/kernel/random/boot_id",
    machine_id_file: str = "/etc/machine-id",
) -> procfs.ProcessIncarnation:
    """The incarnation of `pid` (in this /proc's namespace) as the worker itself sees it, with its
    pidfd inode where the kernel has one (`coroner.pidfs`) and `proc_root` numbers pids as this
    process does."""
    root = pathlib.Path(proc_root) / str(pid)
    try:
        pidfd = os.pidfd_open(pid) if os.path.realpath(proc_root) == "/proc" else None
    except OSError as exc:
        raise RegistrationError(f"cannot open a pidfd for pid {pid} ({exc}); did it exit already?") from exc
    try:
        stat = (root / "stat").read_bytes()
        status = (root / "status").read_bytes()
        ns_link = os.readlink(root / "ns" / "pid")
        boot_id = pathlib.Path(boot_id_file).read_bytes()
        # The pidfd pins what held the number before the reads; while it is not reaped (it may
        # have exited: a child its launcher holds unreaped) the number was not reused, so the reads
        # were of it.
        if pidfd is not None and pidfs.reaped(pidfd):
            raise OSError(errno.ESRCH, "it was reaped while its incarnation was read")
        pidfd_inode = None if pidfd is None else pidfs.inode(pidfd)
    except OSError as exc:
        raise RegistrationError(f"cannot read the incarnation of pid {pid} ({exc}); did it exit already?") from exc
    finally:
        if pidfd is not None:
            os.close(pidfd)
    try:
        machine_id: bytes | None = pathlib.Path(machine_id_file).read_bytes()
    except OSError:
        machine_id = None
    try:
        return procfs.incarnation_from(
            stat=stat,
            status=status,
            pid_namespace_link=ns_link,
            boot_id=boot_id,
            machine_id=machine_id,
            node_name=node_name,
            pidfd_inode=pidfd_inode,
        )
    except procfs.ParseError as exc:
        raise RegistrationError(f"pid {pid}: unreadable incarnation ({exc})") from exc


def _dns_name(text: str) -> str:
    cleaned = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return (cleaned or "worker")[:40].strip("-")


@dataclasses.dataclass(slots=True, kw_only=True)
class Held:
    """A live registration this process made and holds; heartbeats (where opted in) until released or
    stopped. (The registration as the decision reads it is `coroner.core.model.Registration`.)"""

    client: Rest
    namespace: str
    name: str
    interval_seconds: int | None
    """The opted-in heartbeat interval; None: no heartbeats (the default)."""
    body: dict[str, Any]
    _stop: threading.Event = dataclasses.field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    heartbeats: int = 0

    @property
    def _status_path(self) -> str:
        return registrations_path(self.namespace, self.name) + "/status"

    def heartbeat(self) -> None:
        self.body = self.client.request(
            "PATCH",
            self._status_path,
            body=wire.heartbeat_patch(datetime.datetime.now(datetime.UTC)),
            content_type=wire.MERGE_PATCH,
        )
        self.heartbeats += 1

    def start_heartbeats(self) -> None:
        if self.interval_seconds is None:
            return
        interval = self.interval_seconds

        def loop() -> None:
            while not self._stop.wait(interval):
                try:
                    self.heartbeat()
                except ApiError as exc:
                    # A missed heartbeat is not fatal: the TTL tolerates it. Say so and go on.
                    logger.warning(
                        "heartbeat failed workerregistration=%s/%s status=%s", self.namespace, self.name, exc.status
                    )
                except Exception as exc:
                    logger.warning("heartbeat failed workerregistration=%s/%s error=%r", self.namespace, self.name, exc)

        self._thread = threading.Thread(target=loop, name=f"heartbeat-{self.name}", daemon=True)
        self._thread.start()

    def stop_heartbeats(self, *, wait: bool = True) -> None:
        self._stop.set()
        if wait and self._thread is not None:
            self._thread.join(timeout=5)

    def release(self, *, message: str) -> None:
        """Marks Released=True (the worker said goodbye): one server-side apply, no read first.

        The same exit is racing through the agent's Dead attestation and the operator's
        retirement; one request that needs no read is what lets a worker that said goodbye read
        Released, not Retired. If the retirement won (the API server refuses Released on a retired
        registration), the registration is terminal and true either way."""
        condition = wire.released_condition(
            message=message,
            now=datetime.datetime.now(datetime.UTC),
            generation=model.parse_registration(self.body).generation,
        )
        body = wire.release_apply(name=self.name, namespace=self.namespace, condition=condition)
        try:
            _patiently(
                f"the goodbye of {self.namespace}/{self.name}",
                lambda: self.client.request(
                    "PATCH",
                    self._status_path,
                    query={"fieldManager": wire.RELEASE_FIELD_MANAGER, "force": True},
                    body=body,
                    content_type=wire.APPLY_PATCH,
                ),
            )
        except ApiError as exc:
            if exc.status == 422 and model.parse_registration(self._read()).retired:
                logger.info("retired before its goodbye landed workerregistration=%s/%s", self.namespace, self.name)
                return
            raise

    def _read(self) -> dict[str, Any]:
        return self.client.request("GET", registrations_path(self.namespace, self.name))


def register(
    *,
    client: Rest,
    namespace: str,
    node_name: str,
    incarnation: procfs.ProcessIncarnation,
    name: str | None = None,
    role: str = "",
    session_id: str = "",
    generation_id: str = "",
    interval_seconds: int | None = None,
    ttl_seconds: int | None = None,
    node_uid: str | None = None,
) -> Held:
    """Creates the registration (idempotent on retry with the same name and incarnation).

    ``spec.heartbeat`` is written only when both `interval_seconds` and `ttl_seconds` are given:
    heartbeats are the worker's opt-in, not the liveness signal."""
    if (interval_seconds is None) != (ttl_seconds is None):
        raise RegistrationError("heartbeats need both an interval and a TTL (or neither)")
    name = name or f"{_dns_name(role or 'worker')}-{uuid.uuid4().hex[:8]}"
    body = wire.registration_body(
        name=name,
        namespace=namespace,
        node_name=node_name,
        incarnation=incarnation.spec(),
        client_instance_id=f"{api.CLIENT_INSTANCE_PREFIX}{uuid.uuid4()}",
        role=role,
        session_id=session_id,
        generation_id=generation_id,
        node_uid=node_uid,
        heartbeat=None if interval_seconds is None or ttl_seconds is None else (interval_seconds, ttl_seconds),
        registered_by=_registrant(client, namespace=namespace, name=name),
    )
    try:
        created = _patiently(
            f"registering {namespace}/{name}",
            lambda: client.request("POST", registrations_path(namespace), body=body),
        )
    except ApiError as exc:
        if exc.status == 409:
            existing = client.request("GET", registrations_path(namespace, name))
            if (existing.get("spec") or {}).get("incarnation") == incarnation.spec():
                created = existing  # our own earlier attempt: registration is idempotent
            else:
                other = model.parse_registration(existing)
                state = "retired" if other.retired else "released" if other.released else "active"
                raise RegistrationError(
                    f"WorkerRegistration {namespace}/{name} already exists for another incarnation "
                    f"(pid {other.incarnation.pid} on node {other.node_name}, {state}); "
                    f"choose another --name or let the existing one be released or retired"
                ) from exc
        elif exc.status == 404:
            raise RegistrationError(
                f"cannot register in namespace {namespace!r}: the namespace or the WorkerRegistration CRD is "
                f"missing; install the manifests (kubectl apply -k manifests/overlays/plan-only)"
            ) from exc
        elif warming_up(exc):
            token = "; check this identity's token (the kubeconfig, or the pod's ServiceAccount)"
            raise RegistrationError(
                f"registering {namespace}/{name} failed: {exc.status} {exc.reason}: the API server is still "
                f"busy, unavailable or warming up after {PATIENCE_SECONDS:.0f} s ({exc.message})"
                f"{token if exc.status == 401 else ''}"
            ) from exc
        elif exc.status == 403 and " cannot create resource " in exc.message:
            raise RegistrationError(
                f"not allowed to create WorkerRegistrations in namespace {namespace!r}; bind the ClusterRole "
                f"coroner-worker to this identity there"
            ) from exc
        elif exc.status == 403:  # an admission policy's denial: its message is the reason
            raise RegistrationError(f"the API server refused registering {namespace}/{name}: {exc.message}") from exc
        else:
            # The API server's answer names what is wrong (a 422 names the field and the rule it broke).
            raise RegistrationError(
                f"registering {namespace}/{name} failed: {exc.status} {exc.reason}: {exc.message}"
            ) from exc
    registration = Held(client=client, namespace=namespace, name=name, interval_seconds=interval_seconds, body=created)
    if interval_seconds is not None:
        registration.heartbeat()
    return registration


def _registrant(client: Rest, *, namespace: str, name: str) -> str:
    """Who the API server sees registering, from one SelfSubjectReview (again while the server is
    busy or warming up, as the create is), for the annotation the launcher writes: the admission
    policy coroner-registrant-recorded admits a registration only when it names exactly its
    requester, so without the answer there is nothing to register with (a RegistrationError)."""
    what = f"asking the API server who registers {namespace}/{name}"
    try:
        answer = _patiently(
            what,
            lambda: client.request("POST", kubewire.SELF_SUBJECT_REVIEW_PATH, body=dict(kubewire.SELF_SUBJECT_REVIEW)),
        )
    except (ApiError, urllib3.exceptions.HTTPError, OSError) as exc:
        raise RegistrationError(
            f"{what} failed ({exc}): a registration must name its registrant (annotation "
            f"{api.REGISTERED_BY_ANNOTATION}), which the API server checks"
        ) from exc
    registrant = kubewire.registrant(answer)
    if registrant is None:
        raise RegistrationError(f"{what}: its SelfSubjectReview named no user ({answer!r})")
    return registrant


def _patiently(what: str, request: Callable[[], _T]) -> _T:
    """`request()`, again while the API server is unreachable, busy, unavailable or warming up
    (`warming_up`: 429, 5xx, 401, admission's 403 "not yet ready") for up to PATIENCE_SECONDS: while
    it restarts, or right after the CRD is installed, it answers so for a moment, and a worker must
    neither fail to start nor lose its goodbye for that. Both writes may be sent again: a create
    that landed unseen is a 409 the caller recognises as its own; the goodbye is a forced apply."""
    deadline = time.monotonic() + PATIENCE_SECONDS
    delay = 0.2
    while True:
        try:
            return request()
        except (ApiError, urllib3.exceptions.HTTPError) as exc:
            if (isinstance(exc, ApiError) and not warming_up(exc)) or time.monotonic() >= deadline:
                raise
            logger.warning("%s: %s; retrying in %.1fs", what, exc, delay)
        time.sleep(delay)
        delay = min(delay * 2, 5.0)


def client_for(kubeconfig: str | None) -> Rest:
    """The worker's identity: the given kubeconfig, else the pod's ServiceAccount, else ~/.kube/config.

    One that cannot be used (unreadable, or a user that needs an exec or auth-provider plugin,
    which `coroner.client.rest` does not run) is a RegistrationError naming why."""
    try:
        return Rest.default(kubeconfig, user_agent=USER_AGENT, pool_size=2)
    except (OSError, ValueError, KeyError, yaml.YAMLError) as exc:
        where = kubeconfig or "the default kubeconfig (or the pod's ServiceAccount)"
        raise RegistrationError(f"cannot use {where} to register: {exc}") from exc


@contextlib.contextmanager
def registered(
    *,
    namespace: str,
    node_name: str,
    kubeconfig: str | None = None,
    name: str | None = None,
    role: str = "",
    interval_seconds: int | None = None,
    ttl_seconds: int | None = None,
) -> Iterator[Held]:
    """Registers the calling process for the duration of the block; released on a clean exit.

    An exception leaving the block is not a clean exit: the registration stays active (and stops
    heartbeating, where opted in), and is retired once the agent confirms the process is gone.
    """
    client = client_for(kubeconfig)
    incarnation = probe_incarnation(os.getpid(), node_name=node_name)
    registration = register(
        client=client,
        namespace=namespace,
        node_name=node_name,
        incarnation=incarnation,
        name=name,
        role=role,
        interval_seconds=interval_seconds,
        ttl_seconds=ttl_seconds,
    )
    registration.start_heartbeats()
    clean = False
    try:
        yield registration
        clean = True
    finally:
        registration.stop_heartbeats()
        if clean:
            say_goodbye(registration, message="the worker left its registered block cleanly")
        client.close()


def say_goodbye(registration: Held, *, message: str) -> None:
    """The goodbye of a clean exit. One that has not landed within PATIENCE_SECONDS is said, not
    raised: the worker's own exit status stands, and its registration stays active until its
    node's agent confirms the exit, and is retired then."""
    try:
        registration.release(message=message)
    except (ApiError, urllib3.exceptions.HTTPError) as exc:
        logger.warning(
            "coroner: the goodbye of %s/%s did not land (%s); it stays active until the agent of its node "
            "confirms the exit, and is retired then",
            registration.namespace,
            registration.name,
            exc,
        )


_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def run(
    command: Sequence[str],
    *,
    namespace: str,
    node_name: str,
    kubeconfig: str | None = None,
    name: str | None = None,
    role: str = "",
    interval_seconds: int | None = None,
    ttl_seconds: int | None = None,
    proc_root: str = "/proc",
    boot_id_file: str = "/proc/sys/kernel/random/boot_id",
) -> int:
    """`coroner run`: launch, register, forward signals, release on clean exit; returns
    the exit status to exit with (the child's, or 128 + signal number)."""
    client = client_for(kubeconfig)
    forwarded: list[int] = []
    child = subprocess.Popen(list(command))

    def forward(signum: int, _frame: object) -> None:
        forwarded.append(signum)
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in _FORWARDED}
    registration: Held | None = None
    try:
        try:
            incarnation = probe_incarnation(
                child.pid, node_name=node_name, proc_root=proc_root, boot_id_file=boot_id_file
            )
            registration = register(
                client=client,
                namespace=namespace,
                node_name=node_name,
                incarnation=incarnation,
                name=name,
                role=role or pathlib.Path(command[0]).name,
                interval_seconds=interval_seconds,
                ttl_seconds=ttl_seconds,
            )
        except (RegistrationError, ApiError, urllib3.exceptions.HTTPError) as exc:
            # A worker that cannot be registered must not run unregistered: stop it and say why.
            child.terminate()
            child.wait()
            raise RegistrationError(str(exc)) from exc
        print(f"coroner: registered {namespace}/{registration.name} pid={child.pid}", file=sys.stderr, flush=True)
        registration.start_heartbeats()
        returncode = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    registration.stop_heartbeats(wait=False)  # no new heartbeat; the goodbye does not wait for one in flight
    clean = returncode == 0 or (returncode == -signal.SIGTERM and signal.SIGTERM in forwarded)
    if clean:
        say_goodbye(registration, message=f"the worker exited cleanly (status {returncode})")
    registration.stop_heartbeats()
    client.close()
    return returncode if returncode >= 0 else 128 - returncode
