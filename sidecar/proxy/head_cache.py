"""Response heads an upstream repeats, parsed once.

An upstream answers most requests to a route with the same head, byte for byte, for
as long as its Date field says the same second. Scanning a head (`ResponseFields`)
and rewriting it for the client (`headers.response_head`) is a good part of the
proxy's Python work per request, so each pool keeps the heads it has parsed, keyed by
their bytes: a head seen before costs one dictionary lookup, and its rewrite for a
variant is kept with it (`ResponseFields.rewrites`).

The bytes are the upstream's, so the cache is bounded both ways: heads longer than
`MAX_CACHED_HEAD` are never kept, and once `limit` heads are held the cache starts
afresh (heads that keep changing, a Content-Length per response say, then cost a
lookup and an insertion each, and no more memory).
"""

from __future__ import annotations

from typing import Final

from sidecar.proxy.headers import ResponseFields, split_response_head

# longer heads are parsed every time: typical heads are a few hundred bytes
MAX_CACHED_HEAD: Final = 2048
DEFAULT_LIMIT: Final = 64

ParsedHead = tuple[bytes, bytes, ResponseFields]  # (status line, fields, scan)
# a head httptools has seen make, with exactly `body` bytes behind it in one read, one
# whole response of `status` (>= 200, framed by Content-Length) that left the
# connection reusable or not: (status line, fields, scan, status, body, keep-alive)
WholeResponse = tuple[bytes, bytes, ResponseFields, int, int, bool]


class HeadCache:
    """Parsed response heads by their bytes (status line and fields, no blank line);
    `limit` 0 keeps none."""

    __slots__ = ("_heads", "_whole", "hit", "limit", "whole_hits")

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        self.limit = limit
        self._heads: dict[bytes, ParsedHead] = {}
        self._whole: dict[bytes, WholeResponse] = {}
        self.whole_hits = 0  # responses taken whole, without the parser
        self.hit = False  # the last head parsed was found here

    def __len__(self) -> int:
        return len(self._heads)

    def parse(self, head: bytes) -> ParsedHead:
        """(status line as HTTP/1.1, fields, their scan) of a head httptools accepted."""
        parsed = self._heads.get(head)
        if parsed is not None:
            self.hit = True
            return parsed
        self.hit = False
        status_line, fields = split_response_head(head)
        scan = ResponseFields(fields)
        parsed = (status_line, fields, scan)
        if len(head) <= MAX_CACHED_HEAD and self.limit > 0:
            heads = self._heads
            if len(heads) >= self.limit:
                heads.clear()
            scan.rewrites = {}  # shared by every response with this head: keep rewrites
            heads[head] = parsed
        return parsed

    def whole(self, head: bytes) -> WholeResponse | None:
        """What this head made last time it came whole in one read (`learn_whole`)."""
        return self._whole.get(head)

    def learn_whole(
        self, head: bytes, parsed: ParsedHead, status: int, body: int, keep_alive: bool
    ) -> None:
        """httptools parsed `head` and exactly `body` bytes after it, in one read, as
        one complete response (>= 200, Content-Length framing, not to a HEAD).

        The parser's verdict on such a read depends only on those head bytes and the
        count of body bytes: its Content-Length is in the head, and the body's bytes
        are not looked at. So a later read of the same head and the same length is
        that response again, and the connection can take it without the parser
        (`UpstreamConnection` does). Kept under the same bounds as the heads."""
        if len(head) > MAX_CACHED_HEAD or self.limit <= 0:
            return
        whole = self._whole
        if len(whole) >= self.limit:
            whole.clear()
        status_line, fields, scan = parsed
        whole[head] = (status_line, fields, scan, status, body, keep_alive)
