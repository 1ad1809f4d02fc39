"""How the audit trail names an OIDC caller: a verified email, else the subject
qualified by the issuer; bounded, printable, and never one form mistaken for another."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from controlplane.auth.oidc import MAX_ACTOR_CHARS, actor_of, issuer_host
from controlplane.kernel.errors import ConfigError, Unauthenticated

HOST = "login.example.com"
DIGEST = hashlib.sha256("ユーザー".encode()).hexdigest()[:24]


@pytest.mark.parametrize(
    ("label", "claims", "actor"),
    [
        ("unverified email is ignored", {"sub": "mallory", "email": "boss@example.com"},
         "oidc:sub:mallory@login.example.com"),
        ("email_verified false", {"sub": "mallory", "email": "boss@example.com",
                                  "email_verified": False}, "oidc:sub:mallory@login.example.com"),
        ("email_verified as a string is not true", {"sub": "m", "email": "boss@example.com",
                                                    "email_verified": "true"},
         "oidc:sub:m@login.example.com"),
        ("verified email", {"sub": "u-42", "email": "alice@example.com", "email_verified": True},
         "oidc:alice@example.com"),
        ("verified but not a plain address", {"sub": "u-42", "email": "a:b@example.com",
                                              "email_verified": True},
         "oidc:sub:u-42@login.example.com"),
        ("auth0-style subject", {"sub": "google-oauth2|1234"},
         "oidc:sub:google-oauth2|1234@login.example.com"),
        ("workload subject", {"sub": "repo:org/app:ref:refs/heads/main"},
         "oidc:sub:repo:org/app:ref:refs/heads/main@login.example.com"),
        ("verified email with a trailing newline", {"sub": "m", "email": "boss@example.com\n",
                                                    "email_verified": True},
         f"oidc:sub:m@{HOST}"),
        ("subject with a trailing newline", {"sub": "m\n"},
         f"oidc:sub#{hashlib.sha256(b'm' + bytes([10])).hexdigest()[:24]}@{HOST}"),
        ("non-ASCII subject as a digest", {"sub": "ユーザー"}, f"oidc:sub#{DIGEST}@{HOST}"),
        ("control characters as a digest", {"sub": "a\nb"},
         f"oidc:sub#{hashlib.sha256(b'a' + bytes([10]) + b'b').hexdigest()[:24]}@{HOST}"),
    ],
)  # fmt: skip
def test_actor(label: str, claims: dict[str, Any], actor: str) -> None:
    assert actor_of(claims, HOST) == actor, label


@pytest.mark.parametrize("claims", [{"sub": "x" * 5000}, {"sub": "é" * 5000},
                                    {"sub": "u", "email_verified": True,
                                     "email": "a" * 64 + "@" + "b" * 63 + ".com"}])  # fmt: skip
def test_every_actor_is_printable_ascii_within_the_column(claims: dict[str, Any]) -> None:
    actor = actor_of(claims, "h" * 64)
    assert len(actor) <= MAX_ACTOR_CHARS and actor.isascii() and actor.isprintable()


@pytest.mark.parametrize("claims", [{}, {"sub": ""}, {"sub": 42}])
def test_a_token_without_a_subject_names_no_one(claims: dict[str, Any]) -> None:
    with pytest.raises(Unauthenticated):
        actor_of({**claims, "email": "boss@example.com", "email_verified": False}, HOST)


def test_an_email_actor_never_reads_as_a_subject_actor() -> None:
    verified = {"email_verified": True, "sub": "x"}
    assert actor_of({**verified, "email": "sub:mallory@login.example.com"}, HOST) != (
        "oidc:sub:mallory@login.example.com"
    )


@pytest.mark.parametrize(
    ("issuer", "host"),
    [("https://Login.Example.com/", "login.example.com"),
     ("https://kc.example.com/realms/prod", "kc.example.com")],
)  # fmt: skip
def test_the_issuer_host_qualifies_subjects(issuer: str, host: str) -> None:
    assert issuer_host(issuer) == host


@pytest.mark.parametrize("issuer", ["login", "https://" + "a" * 65 + "/", "https://a_b/"])
def test_an_issuer_without_a_plain_short_host_is_a_config_error(issuer: str) -> None:
    with pytest.raises(ConfigError):
        issuer_host(issuer)
