"""A rule's query with its placeholders filled in: the one place PromQL text is built.

The query is the rule author's text and stays so: only `"$variant"` (a whole label
value, `query_problem` saw to it) and `[$window` are replaced, by plain string
substitution, without a PromQL parser. The variant's name goes in as the content of
a double-quoted PromQL string, escaped so that no name, however written, can end the
string and add matchers of its own (`a",__name__=~".+` selects the series whose
label value is that text, nothing else).
"""

from __future__ import annotations

import re

from controlplane.kernel.metric_specs import VARIANT_PLACEHOLDER, WINDOW_PLACEHOLDER, query_problem

# PromQL's escapes are Go's; quotes of the other kinds and the backtick are escaped too
# (as hex), so the name cannot leave a string even where the author used '…' or `…`
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t",
            "'": "\\x27", "`": "\\x60"}  # fmt: skip
# RE2's metacharacters: a name in a regex matcher (=~ "$variant") matches itself only
_RE2_META = re.compile(r"([\\.+*?()|\[\]{}^$])")
_REGEX_MATCHER = re.compile(r"[=!]~\s*$")
MAX_WINDOW_SEC = 366 * 24 * 3600


def promql_string_content(value: str) -> str:
    """`value` as the inside of a double-quoted PromQL string."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("the value is not valid Unicode text") from None
    out = []
    for char in value:
        code = ord(char)
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif code < 0x20 or 0x7F <= code < 0xA0 or 0x2028 <= code <= 0x2029:
            out.append(f"\\u{code:04x}")
        else:
            out.append(char)
    return "".join(out)


def render_query(query: str, variant: str, window_sec: int) -> str:
    """The query as sent for one variant over `window_sec`: `"$variant"` becomes the
    variant's name as a PromQL string (regex-quoted too after `=~`/`!~`), `[$window`
    becomes `[<n>s`; nothing else changes. Raises ValueError on a query the rule
    checks refuse, so an unchecked query is never sent."""
    problem = query_problem(query)
    if problem:
        raise ValueError(f"query refused: {problem}")
    if isinstance(window_sec, bool) or not isinstance(window_sec, int):
        raise ValueError("the window is a whole number of seconds")
    if not 1 <= window_sec <= MAX_WINDOW_SEC:
        raise ValueError(f"the window must be 1..{MAX_WINDOW_SEC} s, not {window_sec}")
    literal = promql_string_content(variant)
    regex = promql_string_content(_RE2_META.sub(r"\\\1", variant))
    placeholder = f'"{VARIANT_PLACEHOLDER}"'
    pieces = query.split(placeholder)
    rendered = [pieces[0]]
    for piece in pieces[1:]:
        content = regex if _REGEX_MATCHER.search(rendered[-1]) else literal
        rendered.append(f'"{content}"')
        rendered.append(piece)
    text = "".join(rendered)
    return text.replace(f"[{WINDOW_PLACEHOLDER}", f"[{window_sec}s")


__all__ = ["MAX_WINDOW_SEC", "promql_string_content", "render_query"]
