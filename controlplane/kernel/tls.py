"""TLS contexts and PEM files from settings, with one-line errors at start-up.

Every process that serves or dials TLS builds its `ssl.SSLContext` here, so a
missing, unreadable or mismatched file is reported the same way everywhere: one
line naming the setting and the file, before anything listens or connects.
"""

from __future__ import annotations

import ssl

from controlplane.kernel.errors import ConfigError
from controlplane.kernel.secrets import read_bounded_file

# A certificate bundle of a few hundred CAs is well under this; more is a wrong file.
MAX_PEM_BYTES = 1024 * 1024


def read_pem(path: str, *, what: str) -> bytes:
    """A PEM file's bytes (for gRPC, which takes bytes rather than paths)."""
    data = read_bounded_file(path, what=what, max_bytes=MAX_PEM_BYTES)
    if b"-----BEGIN " not in data:
        raise ConfigError(f"{what}: {path} is not a PEM file")
    return data


def _no_password() -> bytes:
    # An encrypted key would otherwise make OpenSSL prompt on the terminal.
    raise ConfigError("encrypted private keys are not supported")


def _load_chain(context: ssl.SSLContext, cert_file: str, key_file: str, *, what: str) -> None:
    read_pem(cert_file, what=f"{what} certificate")
    read_pem(key_file, what=f"{what} key")
    try:
        context.load_cert_chain(cert_file, key_file, password=_no_password)
    except ConfigError as exc:
        raise ConfigError(f"{what} key {key_file}: {exc}") from None
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc) or "key values mismatch" in str(exc):
            raise ConfigError(
                f"{what}: the key {key_file} does not belong to the certificate {cert_file}"
            ) from None
        raise ConfigError(
            f"{what}: cannot load {cert_file} with {key_file}: {exc.reason or exc}"
        ) from None


def _load_ca(context: ssl.SSLContext, ca_file: str, *, what: str) -> None:
    read_pem(ca_file, what=what)
    try:
        context.load_verify_locations(cafile=ca_file)
    except ssl.SSLError as exc:
        raise ConfigError(f"{what}: cannot load {ca_file}: {exc.reason or exc}") from None


def server_context(
    *, cert_file: str, key_file: str, client_ca_file: str | None = None, what: str = "TLS"
) -> ssl.SSLContext:
    """A server context; with a client CA, clients must present a certificate it signed."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(context, cert_file, key_file, what=what)
    if client_ca_file:
        _load_ca(context, client_ca_file, what=f"{what} client CA")
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_context(
    *,
    ca_file: str | None = None,
    cert_file: str | None = None,
    key_file: str | None = None,
    what: str = "TLS",
) -> ssl.SSLContext:
    """A client context that verifies the server (the given CA, else the system's) and
    presents a client certificate when one is given."""
    if bool(cert_file) != bool(key_file):
        raise ConfigError(f"{what}: a client certificate needs its key, and a key its certificate")
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if ca_file:
        _load_ca(context, ca_file, what=f"{what} CA")
    if cert_file and key_file:
        _load_chain(context, cert_file, key_file, what=f"{what} client")
    return context
