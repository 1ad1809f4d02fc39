"""Sending a head that `h2` has already checked once.

`h2` normalises and validates every header block it sends (RFC 9113 §8.2: names
lower-case, no connection-specific fields, no CR/LF/NUL, pseudo-fields first...). A
head forwarded from one HTTP/2 peer to another passed the same checks when it was
received, and what the proxy adds to it (X-Forwarded-*, the variant tag, the
upstream's authority) is built from validated values: checking it again costs about
a tenth of the `h2` work of a proxied call (measured: `canary bench sidecar-grpc`,
decision 0019) and finds nothing. Heads translated from HTTP/1.1 are sent checked.
"""

from __future__ import annotations

import h2.connection

from sidecar.proxy.h2.fields import Pair


def send_head(
    conn: h2.connection.H2Connection,
    stream_id: int,
    headers: list[Pair],
    *,
    end_stream: bool,
    checked: bool,
) -> None:
    """`conn.send_headers`, skipping the outbound checks when `checked` (the fields
    came from an HTTP/2 peer through `h2`'s inbound checks)."""
    if not checked:
        conn.send_headers(stream_id, headers, end_stream=end_stream)
        return
    config = conn.config
    validate, normalize = config.validate_outbound_headers, config.normalize_outbound_headers
    # the settings are read during the call only: nothing else runs meanwhile
    config.validate_outbound_headers = config.normalize_outbound_headers = False
    try:
        conn.send_headers(stream_id, headers, end_stream=end_stream)
    finally:
        config.validate_outbound_headers, config.normalize_outbound_headers = validate, normalize
