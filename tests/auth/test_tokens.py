"""API token strings: a trailing line break is not part of any shape we accept."""

from __future__ import annotations

from controlplane.auth.tokens import looks_like_token, new_token, valid_name


def test_a_token_or_a_name_with_a_trailing_newline_is_refused() -> None:
    token = new_token()
    assert looks_like_token(token) and not looks_like_token(token + "\n")
    assert valid_name("ops") and not valid_name("ops\n")
