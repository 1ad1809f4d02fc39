"""The stats-socket client: HAProxy's refusals, and its bounds against a socket that
says too much or nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from routers.haproxy.runtime import CommandRefused, SocketLost, StatsSocket
from tests.support.haproxy_proc import HaproxyProcess


async def test_haproxy_refusals_are_command_refused(
    start_haproxy: Callable[..., HaproxyProcess],
) -> None:
    proc = start_haproxy()
    stats = StatsSocket(proc.socket_path)
    with pytest.raises(CommandRefused, match="No such backend"):
        await stats.set_server_state("v_nope", "up", "ready")
    with pytest.raises(CommandRefused, match="commit map"):
        await stats.commit_map(99, proc.cfg.map_path)
    with pytest.raises(CommandRefused, match="prepare map"):
        await stats.prepare_map("/no/such.map")
    with pytest.raises(CommandRefused, match="not printable"):
        await stats.add_map(1, proc.cfg.map_path, "route", "a;shutdown")
    with pytest.raises(CommandRefused, match="not printable"):
        await stats.add_map(1, proc.cfg.map_path, "route", "a b")
    version = await stats.prepare_map(proc.cfg.map_path)
    await stats.add_map(version, proc.cfg.map_path, "k", "v")
    assert await stats.show_map(proc.cfg.map_path) == []  # not committed yet
    await stats.commit_map(version, proc.cfg.map_path)
    assert [(e.key, e.value) for e in await stats.show_map(proc.cfg.map_path)] == [("k", "v")]


async def test_a_reply_over_the_bound_is_refused_unread(tmp_path: Path) -> None:
    async def spew(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        writer.write(b"x" * 5000)
        await writer.drain()
        writer.close()

    path = str(tmp_path / "spew.sock")
    server = await asyncio.start_unix_server(spew, path)
    async with server:
        with pytest.raises(SocketLost, match="over 4096 bytes"):
            await StatsSocket(path, max_reply=4096).command("show", "info")
        assert len(await StatsSocket(path, max_reply=5000).command("show", "info")) == 5000


async def test_a_silent_socket_times_out(tmp_path: Path) -> None:
    hold = asyncio.Event()

    async def mute(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await hold.wait()
        writer.close()

    path = str(tmp_path / "mute.sock")
    server = await asyncio.start_unix_server(mute, path)
    async with server:
        with pytest.raises(SocketLost, match=r"no answer in 0\.2 s"):
            await StatsSocket(path, timeout=0.2).command("show", "info")
        hold.set()
    with pytest.raises(SocketLost):
        await StatsSocket(str(tmp_path / "gone.sock")).command("show", "info")


async def test_a_version_prepared_and_abandoned_goes_with_the_next_commit(
    start_haproxy: Callable[..., HaproxyProcess],
) -> None:
    proc = start_haproxy()
    stats = StatsSocket(proc.socket_path)
    path = proc.cfg.map_path
    abandoned = await stats.prepare_map(path)
    await stats.add_map(abandoned, path, "route", "half")
    version = await stats.prepare_map(path)
    await stats.add_map(version, path, "route", "whole")
    await stats.commit_map(version, path)
    assert [(e.key, e.value) for e in await stats.show_map(path)] == [("route", "whole")]
