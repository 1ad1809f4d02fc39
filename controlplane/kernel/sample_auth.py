"""HMAC-SHA256 on sample batches: sidecars sign, collectors verify (decision 0009).

The MAC travels in two extra fields of the stream entry, `kid` (which key) and `mac`
(32 bytes), and covers everything a collector acts on: the service (the stream the
entry is in), the kid, the fields `v`, `exp`, `src`, `seq`, `n` and the payload,
each length-prefixed so no two entries share a message. The payload holds the batch's
time, which the collector bounds against its clock (codec.check_times), and
(src, seq) is de-duplicated per collector: together the replay defence.

Pure functions over bytes; the keys come from sample_keys.py.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from collections.abc import Mapping

from controlplane.kernel.errors import CodecError
from controlplane.kernel.sample_keys import KID, SampleKeys

KID_FIELD = "kid"
MAC_FIELD = "mac"
MAC_BYTES = hashlib.sha256().digest_size
SIGNED_FIELDS = ("v", "exp", "src", "seq", "n")
_DOMAIN = b"canary sample batch v1\n"
_LEN = struct.Struct("<I")

# reasons (metric label values) of the CodecError a verifier raises
UNSIGNED = "unsigned"
UNKNOWN_KEY = "unknown_key"
BAD_SIGNATURE = "bad_signature"


def _header(service: bytes, kid: bytes, fields: Mapping[str, bytes], data: bytes) -> bytes:
    parts = [_DOMAIN]
    for value in (service, kid, *(fields.get(name, b"") for name in SIGNED_FIELDS)):
        parts += (_LEN.pack(len(value)), value)
    parts.append(_LEN.pack(len(data)))
    return b"".join(parts)


def _mac(base: hmac.HMAC, service: str, kid: bytes, fields: Mapping[str, bytes]) -> bytes:
    data = fields.get("data", b"")
    mac = base.copy()  # the key schedule is done once per key, not per batch
    mac.update(_header(service.encode(), kid, fields, data))
    mac.update(data)
    return mac.digest()


def _keyed(secret: bytes) -> hmac.HMAC:
    return hmac.new(secret, digestmod=hashlib.sha256)


class SampleSigner:
    """Adds `kid` and `mac` to an entry's fields, with the key set's current key."""

    def __init__(self, keys: SampleKeys) -> None:
        self.kid = keys.current.kid
        self._kid = self.kid.encode()
        self._base = _keyed(keys.current.secret)

    def __repr__(self) -> str:
        return f"SampleSigner(kid={self.kid!r})"

    def sign(self, service: str, fields: Mapping[str, bytes]) -> dict[str, bytes]:
        signed = dict(fields)
        signed[KID_FIELD] = self._kid
        signed[MAC_FIELD] = _mac(self._base, service, self._kid, fields)
        return signed


class SampleVerifier:
    """Accepts an entry signed with any configured key; CodecError(reason) otherwise."""

    def __init__(self, keys: SampleKeys) -> None:
        self.kids = keys.kids
        self._bases = {key.kid.encode(): _keyed(key.secret) for key in keys.keys}

    def __repr__(self) -> str:
        return f"SampleVerifier(kids={list(self.kids)!r})"

    def verify(self, service: str, fields: Mapping[str, bytes]) -> None:
        kid = fields.get(KID_FIELD)
        mac = fields.get(MAC_FIELD)
        if kid is None and mac is None:
            raise CodecError("sample entry is not signed", UNSIGNED)
        if not isinstance(kid, bytes) or not isinstance(mac, bytes) or len(mac) != MAC_BYTES:
            raise CodecError("sample entry has a malformed signature", BAD_SIGNATURE)
        base = self._bases.get(kid)
        if base is None:
            # named only if it is a well-formed kid: the field may hold anything
            text = kid.decode("ascii", "replace")
            shown = repr(text) if KID.fullmatch(text) else f"({len(kid)} bytes)"
            raise CodecError(f"sample entry signed with unknown key {shown}", UNKNOWN_KEY)
        if not hmac.compare_digest(mac, _mac(base, service, kid, fields)):
            raise CodecError("sample entry signature does not match", BAD_SIGNATURE)
