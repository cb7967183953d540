"""The worker side: register an incarnation once, release it on a clean exit, nothing in between.

`coroner run -- CMD` launches CMD as a child and registers the child's own incarnation, probed from
its /proc entries; `registered()` registers the calling process itself (the Python API). Both
create the WorkerRegistration with a fresh launcher-minted `inst-` clientInstanceId and mark
`Released` with one server-side apply of that condition (see `retirement.release_apply`).
Liveness is the node agent's: it pins the incarnation with a pidfd and renews one Lease per node.
A worker that wants a second, worker-side witness opts into heartbeats (``spec.heartbeat``): merge
patches that touch only status.lastHeartbeatTime, every interval.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from coroner.client.kube import APPLY_PATCH, api_client, patch_registration_status
from coroner.core import api, conditions, model, procfs
from coroner.core import wire as retirement
from coroner.core.reasons import ConditionType

logger = logging.getLogger("coroner.launcher")

RELEASED_REASON = "CleanExit"


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
    """The incarnation of `pid` (in this /proc's namespace) as the worker itself sees it."""
    root = pathlib.Path(proc_root) / str(pid)
    try:
        stat = (root / "stat").read_bytes()
        status = (root / "status").read_bytes()
        ns_link = os.readlink(root / "ns" / "pid")
        boot_id = pathlib.Path(boot_id_file).read_bytes()
    except OSError as exc:
        raise RegistrationError(f"cannot read the incarnation of pid {pid} ({exc}); did it exit already?") from exc
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
        )
    except procfs.ParseError as exc:
        raise RegistrationError(f"pid {pid}: unreadable incarnation ({exc})") from exc


def _dns_name(text: str) -> str:
    cleaned = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return (cleaned or "worker")[:40].strip("-")


@dataclasses.dataclass(slots=True, kw_only=True)
class Registration:
    """A live registration this process made; heartbeats (where opted in) until released or stopped."""

    client: k8s.ApiClient
    namespace: str
    name: str
    interval_seconds: int | None
    """The opted-in heartbeat interval; None: no heartbeats (the default)."""
    body: dict[str, Any]
    _stop: threading.Event = dataclasses.field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    heartbeats: int = 0

    def heartbeat(self) -> None:
        now = model.format_time(datetime.datetime.now(datetime.UTC), fraction=True)
        self.body = patch_registration_status(
            self.client, namespace=self.namespace, name=self.name, body={"status": {"lastHeartbeatTime": now}}
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
                except ApiException as exc:
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
        condition = conditions.render_condition(
            model.Condition(
                type=ConditionType.RELEASED.value,
                status="True",
                reason=RELEASED_REASON,
                message=message,
                last_transition_time=datetime.datetime.now(datetime.UTC).replace(microsecond=0),
                observed_generation=model.parse_registration(self.body).generation,
            )
        )
        body = retirement.release_apply(name=self.name, namespace=self.namespace, condition=condition)
        try:
            k8s.CustomObjectsApi(self.client).patch_namespaced_custom_object_status(
                api.GROUP,
                api.VERSION,
                self.namespace,
                api.PLURAL,
                self.name,
                body,
                field_manager=retirement.RELEASE_FIELD_MANAGER,
                force=True,
                _content_type=APPLY_PATCH,
            )
        except ApiException as exc:
            if exc.status == 422 and model.parse_registration(self._read()).retired:
                logger.info("retired before its goodbye landed workerregistration=%s/%s", self.namespace, self.name)
                return
            raise

    def _read(self) -> dict[str, Any]:
        body: dict[str, Any] = k8s.CustomObjectsApi(self.client).get_namespaced_custom_object(
            api.GROUP, api.VERSION, self.namespace, api.PLURAL, self.name
        )
        return body


def register(
    *,
    client: k8s.ApiClient,
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
) -> Registration:
    """Creates the registration (idempotent on retry with the same name and incarnation).

    ``spec.heartbeat`` is written only when both `interval_seconds` and `ttl_seconds` are given:
    heartbeats are the worker's opt-in, not the liveness signal."""
    if (interval_seconds is None) != (ttl_seconds is None):
        raise RegistrationError("heartbeats need both an interval and a TTL (or neither)")
    instance = f"{api.CLIENT_INSTANCE_PREFIX}{uuid.uuid4()}"
    name = name or f"{_dns_name(role or 'worker')}-{uuid.uuid4().hex[:8]}"
    spec: dict[str, Any] = {
        "nodeName": node_name,
        "incarnation": incarnation.spec(),
        "clientInstanceId": instance,
    }
    if interval_seconds is not None:
        spec["heartbeat"] = {"intervalSeconds": interval_seconds, "ttlSeconds": ttl_seconds}
    for key, value in (
        ("role", role),
        ("sessionId", session_id),
        ("generationId", generation_id),
        ("nodeUID", node_uid),
    ):
        if value:
            spec[key] = value
    body = {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {"name": name, "namespace": namespace, "labels": {api.NODE_LABEL: node_name}},
        "spec": spec,
    }
    custom = k8s.CustomObjectsApi(client)
    try:
        created = custom.create_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, body)
    except ApiException as exc:
        if exc.status == 409:
            existing = custom.get_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, name)
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
        elif exc.status == 403:
            raise RegistrationError(
                f"not allowed to create WorkerRegistrations in namespace {namespace!r}; bind the ClusterRole "
                f"coroner-worker to this identity there"
            ) from exc
        else:
            raise RegistrationError(f"registering {namespace}/{name} failed: {exc.status} {exc.reason}") from exc
    registration = Registration(
        client=client, namespace=namespace, name=name, interval_seconds=interval_seconds, body=created
    )
    if interval_seconds is not None:
        registration.heartbeat()
    return registration


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
) -> Iterator[Registration]:
    """Registers the calling process for the duration of the block; released on a clean exit.

    An exception leaving the block is not a clean exit: the registration stays active (and stops
    heartbeating, where opted in), and is retired once the agent confirms the process is gone.
    """
    client = api_client(kubeconfig)
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
            registration.release(message="the worker left its registered block cleanly")
        client.close()


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
    client = api_client(kubeconfig)
    forwarded: list[int] = []
    child = subprocess.Popen(list(command))

    def forward(signum: int, _frame: object) -> None:
        forwarded.append(signum)
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in _FORWARDED}
    registration: Registration | None = None
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
        except (RegistrationError, ApiException) as exc:
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
        registration.release(message=f"the worker exited cleanly (status {returncode})")
    registration.stop_heartbeats()
    client.close()
    return returncode if returncode >= 0 else 128 - returncode
