"""Choose the configuration store from its URL (CANARY_ETCD)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from controlplane.kernel.clock import Clock
from controlplane.kernel.errors import ConfigError
from controlplane.kernel.kv import KeyValueStore

if TYPE_CHECKING:
    from controlplane.kernel.backend_access import EtcdAccess

MEMORY_URL = "memory://"


def open_kv(
    url: str, *, clock: Clock | None = None, access: EtcdAccess | None = None
) -> KeyValueStore:
    """'memory://' -> a new MemoryKV; '[https://]host:port[,…]' -> EtcdKV.

    access: TLS material and the etcd user (`backend_access.etcd_access(settings)`);
    the in-process store ignores it.

    Each call constructs a new store: in-process components of one process must be
    handed the same MemoryKV instance to see each other's keys. The clock drives
    lease expiry of the in-process store; etcd keeps its own time.
    """
    text = url.strip()
    if text == MEMORY_URL or text == "memory:":
        from controlplane.kernel.kv_memory import MemoryKV

        return MemoryKV(clock=clock)
    if text.startswith("memory:"):
        raise ConfigError(f"the in-process store takes no address: use {MEMORY_URL}, not {url!r}")
    if not text:
        raise ConfigError("empty etcd URL: expected host:port[,host:port…] or memory://")
    # Imported here so that a process on the in-process store never loads grpc.
    from controlplane.kernel.kv_etcd import EtcdKV

    return EtcdKV(text, access=access)
