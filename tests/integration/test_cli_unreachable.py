"""``kubectl coroner`` against an API server that is not there, as the real console script meets it.

Two dead servers, no control plane needed: a port where nothing listens (the connection is refused)
and a socket that accepts the TCP connection and never says a word (no TLS handshake, no answer).
Every command gives up on the first request that gets no answer, after one ``--request-timeout``:
a request is never sent again (each retry would add another timeout), which the holding server sees
as exactly one connection per command. No timed assertions: the mechanism is what is checked, the
wall time was measured by hand (see the commit that added this file).
"""

from __future__ import annotations

import contextlib
import pathlib
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import certifi
import pytest
import urllib3

from coroner.cli.session import Connection, PluginError, Session
from coroner_dev.devcluster.cluster import write_kubeconfig

pytestmark = [pytest.mark.procs, pytest.mark.timeout(120)]

PLUGIN = pathlib.Path(sys.executable).parent / "kubectl-coroner"
FINGERPRINT = "v1:sha256:" + "a" * 64
COMMANDS = {
    "plan": ["plan", "-n", "default"],
    "doctor": ["doctor"],
    "apply": [
        "apply",
        "-n",
        "default",
        "w-1",
        f"--registry-fingerprint={FINGERPRINT}",
        f"--candidate-fingerprint={FINGERPRINT}",
    ],
    "version": ["version"],
}


class HoldingServer:
    """Accepts every TCP connection and holds it open without reading or writing; counts them."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.port: int = self.listener.getsockname()[1]
        self.held: list[socket.socket] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                connection, _ = self.listener.accept()
            except TimeoutError:
                continue
            with self._lock:
                self.held.append(connection)

    def take_count(self) -> int:
        """Connections accepted since the last call; closes them."""
        with self._lock:
            held, self.held = self.held, []
        for connection in held:
            connection.close()
        return len(held)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.listener.close()
        self.take_count()


@pytest.fixture
def holding() -> Iterator[HoldingServer]:
    server = HoldingServer()
    try:
        yield server
    finally:
        server.close()


def refused_port() -> int:
    """A port on which nothing listens: bound, never listened on, so connecting is refused."""
    with contextlib.closing(socket.socket()) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def kubeconfig_for(tmp_path: pathlib.Path, port: int) -> pathlib.Path:
    return write_kubeconfig(
        tmp_path / f"{port}.kubeconfig",
        server=f"https://127.0.0.1:{port}",
        ca=pathlib.Path(certifi.where()),
        user="nobody",
        token="x",
    )


def run(kubeconfig: pathlib.Path, args: list[str]) -> subprocess.CompletedProcess[str]:
    command = [str(PLUGIN), *args, "--request-timeout", "1s", f"--kubeconfig={kubeconfig}"]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def the_error(result: subprocess.CompletedProcess[str]) -> str:
    """Exit 2 and one ``error:`` line, no traceback."""
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr + result.stdout
    lines = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith("warning: ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


@pytest.mark.parametrize("command", COMMANDS)
def test_a_server_that_never_answers_is_asked_once(
    command: str, holding: HoldingServer, tmp_path: pathlib.Path
) -> None:
    result = run(kubeconfig_for(tmp_path, holding.port), COMMANDS[command])
    sentence = the_error(result)
    assert f"the Kubernetes API server at https://127.0.0.1:{holding.port} did not answer within" in sentence
    assert "--request-timeout 1s" in sentence and "check that the cluster is running" in sentence
    # One connection: the first request timed out, was not sent again, and no other request followed.
    assert holding.take_count() == 1


@pytest.mark.parametrize("command", COMMANDS)
def test_a_refused_connection_is_one_sentence(command: str, tmp_path: pathlib.Path) -> None:
    port = refused_port()
    sentence = the_error(run(kubeconfig_for(tmp_path, port), COMMANDS[command]))
    assert f"cannot reach the Kubernetes API server at https://127.0.0.1:{port}" in sentence
    assert "Connection refused" in sentence and "--kubeconfig (or KUBECONFIG) and --context" in sentence


@pytest.mark.parametrize("request_timeout", [None, 0.0, 1.0])
def test_a_refused_connection_is_tried_once(
    request_timeout: float | None, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever --request-timeout says, the CLI's client connects once per request: counted where
    urllib3 opens its sockets, against a real refused port."""
    attempts: list[tuple[str, int]] = []
    connect = urllib3.util.connection.create_connection

    def counted(address: tuple[str, int], *args: object, **kwargs: object) -> socket.socket:
        attempts.append(address)
        return connect(address, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(urllib3.util.connection, "create_connection", counted)
    port = refused_port()
    session = Session(Connection(kubeconfig=str(kubeconfig_for(tmp_path, port)), request_timeout=request_timeout))
    with pytest.raises(PluginError) as raised:
        session.list_nodes()
    assert raised.value.unreachable and "Connection refused" in raised.value.message
    assert attempts == [("127.0.0.1", port)]


def test_without_the_flag_a_silent_server_is_given_up_on_after_the_default_connect_time(
    holding: HoldingServer, tmp_path: pathlib.Path
) -> None:
    """The default is 10 s to connect (the TLS handshake included) and 120 s to answer: a server
    that accepts the connection and never says a word is given up on after the first, and the
    sentence says which default that was rather than only the 120 s."""
    session = Session(Connection(kubeconfig=str(kubeconfig_for(tmp_path, holding.port))))
    with pytest.raises(PluginError) as raised:
        session.list_nodes()
    assert raised.value.unreachable
    assert "did not answer within the default 10s to connect and 120s to answer" in raised.value.message
    assert holding.take_count() == 1
