"""The etcd store over TLS with client certificates and etcd users.

The test owns an etcd that serves clients over TLS only (`--client-cert-auth`), with
authentication on: a root user and a `canary` user whose role covers one prefix.
Its tokens live two seconds (`--auth-token-ttl 2`), so an idle client meets an
expired token and must authenticate again without its caller noticing.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from controlplane.kernel.backend_access import EtcdAccess, etcd_access
from controlplane.kernel.errors import (
    BackendError,
    BackendUnavailable,
    ConfigError,
    NotLeader,
    RevisionConflict,
)
from controlplane.kernel.kv import EventKind, KeyValueStore
from controlplane.kernel.kv_etcd import EtcdKV
from controlplane.kernel.kv_factory import open_kv
from controlplane.kernel.settings import Settings
from controlplane.kernel.tls import read_pem
from tests.support.tcp_cut import TcpCut
from tests.support.tls import Pki, TlsEtcdProcess, make_pki

WAIT = 15.0  # an upper bound so a broken client fails instead of hanging
PREFIX = "/canary-secure/"
USER = "canary"
PASSWORD = "s3cret-" + uuid.uuid4().hex[:8]
TOKEN_TTL = 2


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def secure_etcd(pki: Pki) -> Iterator[TlsEtcdProcess]:
    proc = TlsEtcdProcess(pki, auth_token_ttl=TOKEN_TTL)
    proc.start()
    try:
        proc.enable_auth(user=USER, password=PASSWORD, prefix=PREFIX,
                         root_password="root-" + PASSWORD)
        yield proc
    finally:
        proc.close()


@pytest.fixture
def password_file(tmp_path: Path) -> str:
    path = tmp_path / "etcd-password"
    path.write_text(PASSWORD + "\n")
    return str(path)


def settings_for(etcd: TlsEtcdProcess, pki: Pki, **overrides: str) -> Settings:
    fields = {
        "etcd": etcd.endpoint,
        "etcd_ca_file": pki.ca_file,
        "etcd_cert_file": pki.client_cert,
        "etcd_key_file": pki.client_key,
        "etcd_user": USER,
    }
    fields.update(overrides)
    return Settings(**fields)


@pytest.fixture
async def store(
    secure_etcd: TlsEtcdProcess, pki: Pki, password_file: str
) -> AsyncIterator[KeyValueStore]:
    settings = settings_for(secure_etcd, pki, etcd_password_file=password_file)
    kv = open_kv(settings.etcd, access=etcd_access(settings))
    try:
        yield kv
    finally:
        await kv.close()


def quick(endpoint: str, access: EtcdAccess) -> EtcdKV:
    """A client that gives up after one short attempt: the failure cases."""
    return EtcdKV(endpoint, access=access, timeout=2.0, rpc_attempts=1)


def key(name: str) -> str:
    return f"{PREFIX}{uuid.uuid4().hex[:8]}/{name}"


async def test_the_contract_basics_hold_over_tls_with_a_user(store: KeyValueStore) -> None:
    base = key("")
    async with asyncio.timeout(WAIT):
        first = await store.put(base + "a", b"1")
        got = await store.get(base + "a")
        assert got is not None and got.value == b"1" and got.mod_revision == first

        second = await store.compare_and_swap(base + "a", b"2", expected_mod_revision=first)
        assert second > first
        with pytest.raises(RevisionConflict):
            await store.compare_and_swap(base + "a", b"3", expected_mod_revision=first)

        events = store.watch_prefix(base, start_revision=second)
        try:
            await store.put(base + "b", b"x")
            assert await store.delete(base + "b")
            seen = [await anext(events), await anext(events)]
        finally:
            await events.aclose()  # type: ignore[attr-defined]
        assert [(e.kind, e.key) for e in seen] == [
            (EventKind.PUT, base + "b"), (EventKind.DELETE, base + "b")]

        items, revision = await store.get_prefix(base)
        assert [i.key for i in items] == [base + "a"] and revision >= second

        leadership = store.leadership(base + "leader", identity="one", ttl=5)
        fence = await leadership.campaign()
        await store.put(base + "fenced", b"ok", fence=fence)
        await leadership.resign()
        with pytest.raises(NotLeader):
            await store.put(base + "fenced", b"late", fence=fence)
        await store.ping()


async def test_an_expired_token_is_renewed_without_the_caller_noticing(
    store: KeyValueStore, secure_etcd: TlsEtcdProcess, pki: Pki, password_file: str
) -> None:
    access = etcd_access(settings_for(secure_etcd, pki, etcd_password_file=password_file))
    assert isinstance(store, EtcdKV)
    base = key("")
    await store.put(base + "k", b"v")
    stale = store._token
    assert stale
    # etcd keeps its own time, and every use of a simple token extends it: leave the
    # client idle past the TTL (etcd sweeps expired tokens every second)
    await asyncio.sleep(TOKEN_TTL + 2)

    async with asyncio.timeout(WAIT):
        got = await store.get(base + "k")
        assert got is not None and got.value == b"v"
        # the client drops a token only when etcd refuses it
        assert store._token not in (None, stale)
        # a watch opened with a token that has meanwhile expired is renewed as well
        seen = await store.put(base + "r", b"")
        before = store._token
    await asyncio.sleep(TOKEN_TTL + 2)
    writer = EtcdKV(secure_etcd.endpoint, access=access)
    try:
        async with asyncio.timeout(WAIT):
            await writer.put(base + "w", b"1")
            events = store.watch_prefix(base, start_revision=seen)
            try:
                event = await anext(events)
            finally:
                await events.aclose()  # type: ignore[attr-defined]
    finally:
        await writer.close()
    assert store._token != before
    assert event.key == base + "w"


async def test_a_wrong_password_is_a_clear_error_without_the_password(
    secure_etcd: TlsEtcdProcess, pki: Pki, tmp_path: Path
) -> None:
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-password\n")
    settings = settings_for(secure_etcd, pki, etcd_password_file=str(wrong))
    kv = quick(settings.etcd, etcd_access(settings))
    try:
        async with asyncio.timeout(WAIT):
            with pytest.raises(BackendUnavailable) as caught:
                await kv.get(key("k"))
    finally:
        await kv.close()
    message = str(caught.value)
    assert "authentication as 'canary' failed" in message
    assert "not-the-password" not in message and "\n" not in message


async def test_without_a_user_the_certificate_name_is_the_user_and_lacks_a_role(
    secure_etcd: TlsEtcdProcess, pki: Pki
) -> None:
    access = EtcdAccess(ca=read_pem(pki.ca_file, what="ca"),
                        cert=read_pem(pki.client_cert, what="c"),
                        key=read_pem(pki.client_key, what="k"))
    kv = quick(secure_etcd.endpoint, access)
    try:
        async with asyncio.timeout(WAIT):
            # etcd takes the client certificate's common name as the user
            with pytest.raises(BackendError, match="permission denied"):
                await kv.get(key("k"))
    finally:
        await kv.close()


async def test_keys_outside_the_users_role_are_refused_as_permission_denied(
    store: KeyValueStore,
) -> None:
    async with asyncio.timeout(WAIT):
        with pytest.raises(BackendError, match="permission denied"):
            await store.put("/elsewhere/k", b"v")


async def test_a_wrong_ca_fails_promptly_as_unavailable(
    secure_etcd: TlsEtcdProcess, pki: Pki, password_file: str
) -> None:
    settings = settings_for(secure_etcd, pki, etcd_ca_file=pki.other_ca_file,
                            etcd_password_file=password_file)
    kv = quick(settings.etcd, etcd_access(settings))
    try:
        async with asyncio.timeout(WAIT):
            with pytest.raises(BackendUnavailable):
                await kv.get(key("k"))
    finally:
        await kv.close()


async def test_no_client_certificate_fails_promptly_as_unavailable(
    secure_etcd: TlsEtcdProcess, pki: Pki, password_file: str
) -> None:
    settings = Settings(etcd=secure_etcd.endpoint, etcd_ca_file=pki.ca_file, etcd_user=USER,
                        etcd_password_file=password_file)
    kv = quick(settings.etcd, etcd_access(settings))
    try:
        async with asyncio.timeout(WAIT):
            with pytest.raises(BackendUnavailable):
                await kv.get(key("k"))
    finally:
        await kv.close()


def test_unreadable_or_half_given_tls_files_are_one_line_config_errors(
    pki: Pki, tmp_path: Path
) -> None:
    cases = [
        Settings(etcd_ca_file=str(tmp_path / "missing.pem")),
        Settings(etcd_cert_file=pki.client_cert),
        Settings(etcd_user=USER),
        Settings(etcd_password="x"),
        Settings(etcd_user=USER, etcd_password_file=str(tmp_path / "missing")),
    ]
    for settings in cases:
        with pytest.raises(ConfigError) as caught:
            etcd_access(settings)
        assert "\n" not in str(caught.value)


def test_the_password_stays_out_of_the_settings_repr() -> None:
    assert "hunter2" not in repr(Settings(etcd_user=USER, etcd_password="hunter2"))


async def test_each_member_of_a_list_is_checked_against_its_own_name(
    secure_etcd: TlsEtcdProcess, pki: Pki, password_file: str
) -> None:
    """Two members (the first a relay to the same etcd): the client authenticates and
    writes while the first is away, each certificate is checked against the name its
    member was reached by, and a member that drops out leaves the other serving."""
    relay = TcpCut("127.0.0.1", secure_etcd.port)  # not listening yet
    endpoints = f"https://localhost:{relay.port},{secure_etcd.endpoint}"
    settings = Settings(
        etcd=endpoints, etcd_ca_file=pki.ca_file, etcd_cert_file=pki.client_cert,
        etcd_key_file=pki.client_key, etcd_user=USER, etcd_password_file=password_file,
    )
    kv = open_kv(settings.etcd, access=etcd_access(settings))
    name = key("members")
    try:
        async with asyncio.timeout(WAIT):
            await kv.put(name, b"first")  # authenticates past the member that is away
            await relay.heal()
            for n in range(4):  # in turn over both members
                await kv.put(name, b"%d" % n)
            await relay.cut()
            for n in range(4, 8):
                await kv.put(name, b"%d" % n)
                got = await kv.get(name)
                assert got is not None and got.value == b"%d" % n
    finally:
        await kv.close()
        await relay.cut()
