"""Telling an HTTP/2 client from an HTTP/1.1 one by its first bytes (RFC 9113 §3.4)."""

from __future__ import annotations

import ssl
from typing import Literal

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
ALPN_H2 = "h2"
ALPN_HTTP1 = "http/1.1"


def preface_state(data: bytes) -> Literal["h2", "http1", "more"]:
    """ "h2" when `data` starts with the preface, "more" while it is a strict prefix of
    it (the preface came in pieces), "http1" otherwise."""
    if data.startswith(PREFACE):
        return "h2"
    if PREFACE.startswith(data):
        return "more"
    return "http1"


def negotiated_h2(ssl_object: object) -> bool:
    """ALPN chose h2 on this TLS connection."""
    if not isinstance(ssl_object, ssl.SSLObject | ssl.SSLSocket):
        return False
    return ssl_object.selected_alpn_protocol() == ALPN_H2


def offer_h2(context: ssl.SSLContext) -> None:
    """Make a listener's TLS context offer h2 before http/1.1 (ALPN)."""
    context.set_alpn_protocols([ALPN_H2, ALPN_HTTP1])
