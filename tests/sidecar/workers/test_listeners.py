"""The supervisor's hold on the port: what it lets workers do, and what it refuses."""

from __future__ import annotations

import errno
import socket
import sys

import pytest

from sidecar.workers.listeners import ListenMode, platform_mode, reserve

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SO_REUSEPORT")


def refused(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return False
    except ConnectionRefusedError:
        return True


@linux_only
def test_linux_balances_with_reuseport() -> None:
    assert platform_mode() is ListenMode.REUSEPORT


@linux_only
def test_the_reserved_port_takes_no_connection_itself_but_workers_can_join() -> None:
    listener = reserve("127.0.0.1", 0, ListenMode.REUSEPORT)
    try:
        assert listener.port > 0 and listener.fd is None
        assert refused(listener.port)  # bound, never listening: no connection lands there
        with socket.socket() as worker:
            worker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            worker.bind(("127.0.0.1", listener.port))
            worker.listen()
            with socket.create_connection(("127.0.0.1", listener.port), timeout=2):
                accepted, _ = worker.accept()
                accepted.close()
    finally:
        listener.close()


@linux_only
def test_a_process_outside_the_group_cannot_take_the_reserved_port() -> None:
    listener = reserve("127.0.0.1", 0, ListenMode.REUSEPORT)
    try:
        with socket.socket() as other, pytest.raises(OSError) as caught:
            other.bind(("127.0.0.1", listener.port))
        assert caught.value.errno == errno.EADDRINUSE
    finally:
        listener.close()


def test_the_inherited_socket_listens_and_is_handed_down() -> None:
    listener = reserve("127.0.0.1", 0, ListenMode.INHERITED)
    try:
        fd = listener.fd
        assert fd is not None
        shared = socket.socket(fileno=socket.dup(fd))
        assert shared.get_inheritable() is False  # a dup is not, the original is
        assert listener.sockets[0].get_inheritable()
        with shared, socket.create_connection(("127.0.0.1", listener.port), timeout=2):
            accepted, _ = shared.accept()
            accepted.close()
    finally:
        listener.close()


@pytest.mark.parametrize("mode", list(ListenMode))
def test_a_port_in_use_is_refused_before_any_worker(mode: ListenMode) -> None:
    if mode is ListenMode.REUSEPORT and not sys.platform.startswith("linux"):
        pytest.skip("SO_REUSEPORT")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(OSError) as caught:
            reserve("127.0.0.1", busy.getsockname()[1], mode)
        assert caught.value.errno == errno.EADDRINUSE


def test_closing_releases_the_port() -> None:
    listener = reserve("127.0.0.1", 0, ListenMode.INHERITED)
    port = listener.port
    listener.close()
    assert listener.sockets == []
    with socket.socket() as again:
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", port))
