"""Sample keys (parsing, loading, never shown) and the batch MAC (sign, verify, rotate)."""

from __future__ import annotations

import base64
import secrets
from pathlib import Path

import pytest

from controlplane.kernel.codec import BatchBuilder, BatchMeta, entry_fields
from controlplane.kernel.errors import CodecError, ConfigError
from controlplane.kernel.sample_auth import (
    BAD_SIGNATURE,
    KID_FIELD,
    MAC_FIELD,
    UNKNOWN_KEY,
    UNSIGNED,
    SampleSigner,
    SampleVerifier,
)
from controlplane.kernel.sample_keys import load_sample_keys, parse_sample_keys

OLD = secrets.token_bytes(32)
NEW = secrets.token_bytes(48)


def keys_text(*pairs: tuple[str, bytes]) -> str:
    return "\n".join(f"{kid}:{secret.hex()}" for kid, secret in pairs)


def entry() -> dict[str, bytes]:
    builder = BatchBuilder()
    builder.add(1_800_000_000.0, "canary", 1234, 200)
    return entry_fields(BatchMeta("42", "sc-1", 7, 1), builder.encode())


def test_hex_and_base64_secrets_comments_and_order() -> None:
    text = f"# rotation in progress\nnew:{base64.b64encode(NEW).decode()}\n\nold:{OLD.hex()}\n"
    keys = parse_sample_keys(text, origin="keys.txt")
    assert keys.kids == ("new", "old") and keys.current.kid == "new"
    assert keys.current.secret == NEW and keys.keys[1].secret == OLD
    # urlsafe base64 too, and the environment's comma-separated form
    inline = f"a:{base64.urlsafe_b64encode(NEW).decode()},b:{OLD.hex()}"
    assert parse_sample_keys(inline, origin="env").kids == ("a", "b")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("k1:" + secrets.token_bytes(16).hex(), "16 bytes, at least 32"),
        ("k1:not*base64*at*all", "neither hex nor base64"),
        ("k 1:" + OLD.hex(), "key 1"),  # a space splits it: 'k' has no secret
        ("no-colon-here", "expected kid:secret"),
        ("../x:" + OLD.hex(), "expected kid:secret"),
        ("", "no sample keys"),
        (f"k:{OLD.hex()}\nk:{NEW.hex()}", "unique"),
    ],
    # the texts hold random secrets: stable ids let every test process collect the same tests
    ids=["short", "not-base64", "space-in-kid", "no-colon", "path-kid", "empty", "duplicate"],
)
def test_bad_key_sets_are_refused_without_showing_a_secret(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        parse_sample_keys(text, origin="keys.txt")
    secret = text.partition(":")[2]
    assert not secret or secret not in str(caught.value)


def test_repr_names_kids_only() -> None:
    keys = parse_sample_keys(keys_text(("k1", OLD)), origin="x")
    for shown in (repr(keys), repr(keys.current), repr(SampleSigner(keys)),
                  repr(SampleVerifier(keys))):  # fmt: skip
        assert OLD.hex() not in shown and "k1" in shown


def test_loading_prefers_the_flag_then_the_file_variable_then_the_keys(tmp_path: Path) -> None:
    flag = tmp_path / "flag.keys"
    flag.write_text(keys_text(("flag", OLD)))
    file = tmp_path / "env.keys"
    file.write_text(keys_text(("file", OLD)))
    env = {"CANARY_SAMPLE_KEYS_FILE": str(file), "CANARY_SAMPLE_KEYS": f"inline:{OLD.hex()}"}
    loaded = load_sample_keys(flag, env)
    assert loaded is not None and loaded.kids == ("flag",)
    loaded = load_sample_keys(None, env)
    assert loaded is not None and loaded.kids == ("file",)
    loaded = load_sample_keys(None, {"CANARY_SAMPLE_KEYS": f"inline:{OLD.hex()}"})
    assert loaded is not None and loaded.kids == ("inline",)
    assert load_sample_keys(None, {}) is None
    with pytest.raises(ConfigError, match="cannot read"):
        load_sample_keys(tmp_path / "missing", {})


def test_signed_entry_verifies_and_every_tampering_is_refused() -> None:
    keys = parse_sample_keys(keys_text(("k1", OLD)), origin="x")
    signed = SampleSigner(keys).sign("payment-api", entry())
    verifier = SampleVerifier(keys)
    verifier.verify("payment-api", signed)

    def reason(fields: dict[str, bytes], service: str = "payment-api") -> str:
        with pytest.raises(CodecError) as caught:
            verifier.verify(service, fields)
        return caught.value.reason

    assert reason(entry()) == UNSIGNED
    flipped = bytearray(signed["data"])
    flipped[20] ^= 0x01
    assert reason({**signed, "data": bytes(flipped)}) == BAD_SIGNATURE
    assert reason({**signed, "exp": b"43"}) == BAD_SIGNATURE
    assert reason({**signed, "seq": b"8"}) == BAD_SIGNATURE
    assert reason({**signed, "src": b"sc-2"}) == BAD_SIGNATURE
    assert reason(signed, service="other-api") == BAD_SIGNATURE  # moved to another stream
    assert reason({**signed, MAC_FIELD: signed[MAC_FIELD][:-1]}) == BAD_SIGNATURE
    without_mac = {k: v for k, v in signed.items() if k != MAC_FIELD}
    assert reason(without_mac) == BAD_SIGNATURE
    assert reason({**signed, KID_FIELD: b"k2"}) == UNKNOWN_KEY
    wrong_key = parse_sample_keys(keys_text(("k1", NEW)), origin="x")
    assert reason(SampleSigner(wrong_key).sign("payment-api", entry())) == BAD_SIGNATURE


def test_rotation_signer_uses_the_first_key_verifier_accepts_every_key() -> None:
    before = parse_sample_keys(keys_text(("old", OLD)), origin="x")
    during = parse_sample_keys(keys_text(("new", NEW), ("old", OLD)), origin="x")
    after = parse_sample_keys(keys_text(("new", NEW)), origin="x")
    from_old = SampleSigner(before).sign("svc", entry())
    from_new = SampleSigner(during).sign("svc", entry())
    assert from_old[KID_FIELD] == b"old" and from_new[KID_FIELD] == b"new"
    verifier = SampleVerifier(during)
    verifier.verify("svc", from_old)
    verifier.verify("svc", from_new)
    SampleVerifier(after).verify("svc", from_new)
    with pytest.raises(CodecError) as caught:
        SampleVerifier(after).verify("svc", from_old)
    assert caught.value.reason == UNKNOWN_KEY
