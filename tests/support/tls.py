"""Test certificates (trustme) and TLS-only etcd and redis-server processes.

Every process runs on its own free ports with its own data directory; the shared
services are never touched.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import trustme

from tests.support.processes import EtcdProcess, RedisProcess, etcd_binary


@dataclass(frozen=True)
class Pki:
    """A CA, a server certificate for 127.0.0.1/localhost, a client certificate, and an
    unrelated CA (what a client trusting the wrong CA has)."""

    ca_file: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    other_ca_file: str


def make_pki(directory: Path, *, client_name: str = "canary-client") -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    ca, other = trustme.CA(), trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert(client_name)
    paths = {name: directory / f"{name}.pem" for name in (
        "ca", "server-cert", "server-key", "client-cert", "client-key", "other-ca")}
    ca.cert_pem.write_to_path(str(paths["ca"]))
    other.cert_pem.write_to_path(str(paths["other-ca"]))
    server.private_key_pem.write_to_path(str(paths["server-key"]))
    client.private_key_pem.write_to_path(str(paths["client-key"]))
    for blob in server.cert_chain_pems:
        blob.write_to_path(str(paths["server-cert"]), append=True)
    for blob in client.cert_chain_pems:
        blob.write_to_path(str(paths["client-cert"]), append=True)
    return Pki(
        ca_file=str(paths["ca"]), server_cert=str(paths["server-cert"]),
        server_key=str(paths["server-key"]), client_cert=str(paths["client-cert"]),
        client_key=str(paths["client-key"]), other_ca_file=str(paths["other-ca"]),
    )  # fmt: skip


class TlsEtcdProcess(EtcdProcess):
    """etcd serving clients over TLS only, requiring client certificates."""

    def __init__(self, pki: Pki, *, auth_token_ttl: int = 300) -> None:
        super().__init__()
        self.pki = pki
        self.auth_token_ttl = auth_token_ttl

    @property
    def endpoint(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        client = f"https://127.0.0.1:{self.port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        return [
            etcd_binary(),
            "--name", "t",
            "--data-dir", str(self.workdir / "data"),
            "--listen-client-urls", client,
            "--advertise-client-urls", client,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"t={peer}",
            "--cert-file", self.pki.server_cert,
            "--key-file", self.pki.server_key,
            "--trusted-ca-file", self.pki.ca_file,
            "--client-cert-auth",
            "--auth-token-ttl", str(self.auth_token_ttl),
        ]  # fmt: skip

    def etcdctl(self, *args: str, user: str | None = None) -> str:
        """Run etcdctl against this etcd over TLS (as `user` 'name:password' if given)."""
        binary = shutil.which("etcdctl") or str(Path(sys.prefix) / "bin" / "etcdctl")
        command = [
            binary, "--endpoints", self.endpoint, "--cacert", self.pki.ca_file,
            "--cert", self.pki.client_cert, "--key", self.pki.client_key,
        ]  # fmt: skip
        if user:
            command += ["--user", user]
        done = subprocess.run(
            [*command, *args], capture_output=True, text=True, timeout=30, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"etcdctl {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def enable_auth(self, *, user: str, password: str, prefix: str, root_password: str) -> None:
        """A root user, and `user` with read-write on `prefix` only; then auth on."""
        self.etcdctl("user", "add", f"root:{root_password}", "--interactive=false")
        self.etcdctl("role", "add", "root")
        self.etcdctl("user", "grant-role", "root", "root")
        self.etcdctl("user", "add", f"{user}:{password}", "--interactive=false")
        self.etcdctl("role", "add", user)
        self.etcdctl("role", "grant-permission", user, "--prefix=true", "readwrite", prefix)
        self.etcdctl("user", "grant-role", user, user)
        self.etcdctl("auth", "enable")


class TlsRedisProcess(RedisProcess):
    """redis-server on a TLS port only, with an ACL user and no default user."""

    def __init__(self, pki: Pki, *, user: str, password: str, client_certs: str = "no") -> None:
        super().__init__()
        self.pki = pki
        self.user = user
        self.password = password
        self.client_certs = client_certs

    @property
    def url(self) -> str:
        return f"rediss://{self.user}:{self.password}@127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        acl = self.workdir / "users.acl"
        acl.write_text(
            "user default off\n"
            f"user {self.user} on >{self.password} ~* &* +@all\n"
        )
        return [
            shutil.which("redis-server") or "redis-server",
            "--port", "0",
            "--tls-port", str(self.port),
            "--bind", "127.0.0.1",
            "--tls-cert-file", self.pki.server_cert,
            "--tls-key-file", self.pki.server_key,
            "--tls-ca-cert-file", self.pki.ca_file,
            "--tls-auth-clients", self.client_certs,
            "--aclfile", str(acl),
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.workdir),
        ]  # fmt: skip
