"""An asyncio client of HAProxy's stats socket (the runtime API), one command per
connection.

HAProxy answers a command sent without `prompt` and closes the connection, so a
lost or restarted HAProxy costs one failed command, never a stale session. Every
reply is bounded (MAX_REPLY) and every command has a deadline. HAProxy's replies
carry no status code: each helper knows what success looks like for its command
(an empty reply for most) and raises CommandRefused with HAProxy's own first line
otherwise.

    RuntimeApiError
    ├── SocketLost       no socket, refused, reset, timed out, reply too long
    └── CommandRefused   HAProxy answered, but not with success
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Final

MAX_REPLY: Final = 1 << 20
_LINE_MAX = 200  # of a refusal quoted in an error message
_VERSION = re.compile(r"^New version created: ([0-9]{1,10})$")
_WORD = re.compile(r"^[!-~]{1,4096}$")  # printable, no space
_SERVER_ADDR_OK = ("IP changed", "no need to change")


class RuntimeApiError(Exception):
    """The runtime API did not do what was asked."""


class SocketLost(RuntimeApiError):
    """The stats socket could not be used: HAProxy is not there or did not answer."""


class CommandRefused(RuntimeApiError):
    """HAProxy answered a command with something other than success."""


@dataclass(frozen=True, slots=True)
class MapEntry:
    key: str
    value: str


class StatsSocket:
    """Commands to one HAProxy's admin-level stats socket."""

    def __init__(self, path: str, *, timeout: float = 2.0, max_reply: int = MAX_REPLY) -> None:
        self.path = path
        self.timeout = timeout
        self.max_reply = max_reply

    async def command(self, *words: str) -> str:
        """Send one command (its words checked: printable, no spaces) and return the
        reply without its trailing blank line."""
        for word in words:
            # `;` chains commands and a newline ends one: neither may come in a word
            if not _WORD.match(word) or ";" in word:
                raise CommandRefused("a command word is empty, too long or not printable")
        line = " ".join(words).encode("ascii") + b"\n"
        try:
            async with asyncio.timeout(self.timeout):
                reader, writer = await asyncio.open_unix_connection(self.path)
                try:
                    writer.write(line)
                    await writer.drain()
                    reply = await reader.read(self.max_reply + 1)
                    while reply and len(reply) <= self.max_reply:
                        more = await reader.read(self.max_reply + 1 - len(reply))
                        if not more:
                            break
                        reply += more
                finally:
                    writer.close()
        except TimeoutError as exc:
            raise SocketLost(f"stats socket {self.path}: no answer in {self.timeout} s") from exc
        except OSError as exc:
            raise SocketLost(f"stats socket {self.path}: {exc.strerror or exc}") from exc
        if len(reply) > self.max_reply:
            raise SocketLost(f"stats socket {self.path}: reply over {self.max_reply} bytes")
        return reply.decode("utf-8", "replace").rstrip("\n")

    async def expect_empty(self, *words: str) -> None:
        reply = await self.command(*words)
        if reply.strip():
            raise CommandRefused(f"{' '.join(words[:3])}: {_first_line(reply)}")

    async def prepare_map(self, map_path: str) -> int:
        reply = await self.command("prepare", "map", map_path)
        found = _VERSION.match(reply.strip())
        if found is None:
            raise CommandRefused(f"prepare map: {_first_line(reply)}")
        return int(found.group(1))

    async def add_map(self, version: int, map_path: str, key: str, value: str) -> None:
        await self.expect_empty("add", "map", f"@{version}", map_path, key, value)

    async def commit_map(self, version: int, map_path: str) -> None:
        await self.expect_empty("commit", "map", f"@{version}", map_path)

    async def show_map(self, map_path: str) -> list[MapEntry]:
        """The map's entries in force (its current version)."""
        reply = await self.command("show", "map", map_path)
        entries = []
        for row in reply.splitlines():
            # "<pointer> <key> <value>"; a refusal is one line of words not so shaped
            pointer, _, rest = row.partition(" ")
            key, sep, value = rest.partition(" ")
            if not pointer.startswith("0x") or not sep:
                raise CommandRefused(f"show map: {_first_line(reply)}")
            entries.append(MapEntry(key, value))
        return entries

    async def set_server_addr(self, backend: str, server: str, ip: str, port: int) -> None:
        reply = await self.command(
            "set", "server", f"{backend}/{server}", "addr", ip, "port", str(port)
        )
        if not reply.startswith(_SERVER_ADDR_OK):
            raise CommandRefused(f"set server {backend}/{server} addr: {_first_line(reply)}")

    async def set_server_state(self, backend: str, server: str, state: str) -> None:
        await self.expect_empty("set", "server", f"{backend}/{server}", "state", state)


def _first_line(reply: str) -> str:
    line = reply.strip().partition("\n")[0]
    return (line[:_LINE_MAX] or "(empty reply)").encode("ascii", "replace").decode()


__all__ = [
    "MAX_REPLY",
    "CommandRefused",
    "MapEntry",
    "RuntimeApiError",
    "SocketLost",
    "StatsSocket",
]
