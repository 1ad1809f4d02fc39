"""The one access-log line HAProxy sends per request, and the names of its fields.

`render.py` puts `LOG_FORMAT` in the base config and `log_lines.py` parses what it
produces; both read the field order from here. One line is space-separated fields,
every one of a fixed character set, so no quoting is needed:

    cx3 <token> <service> <experiment> <salt> <variant>
        %ST %Ta %TR %Tw %Tc %Tr %Tt %Ts.%ms %ts <unit hex> .

(one line, space-separated, wrapped here).

- `cx3`: the format's name and version; a line without it is not ours (`cx1`, without
  `%Tt`, was never released; `cx2` had no token).
- token: the agent's log token (routers/samples/token.py), from the route value in
  the map (route_value.py); `-` when no route is in force (the map holds none).
- service, experiment, salt, variant: the frontend's service (rendered in) and what
  the request's route and assignment said; `-` when unset (no route in force).
- `%ST` the status sent to the client; `%Ta` the active time of the request, from
  the first byte of the request to the end of the response (total); `%TR`, `%Tw`,
  `%Tc`, `%Tr` the request, queue, connect and server-response times, so the time
  to the server's response headers is `TR + Tw + Tc + Tr`. HAProxy gives every timer
  in milliseconds; -1 where the phase never ended (`%Tr` -1: no response head).
- `%Tt` the time from the accept date to the end of the request, so the sample's
  time is `accept + Tt`: the request's end, as a sidecar stamps it. `%Ts.%ms` alone
  would not do: on a kept-alive connection the accept date is the end of the
  previous request, and a connection idle longer than a window made its next
  sample late (dropped by the collector as older than the window).
- `%Ts.%ms` the accept date, seconds since the epoch and milliseconds.
- `%ts` the termination state (two characters, `--` for a normal end): who ended
  an exchange that got no response head, and in which phase.
- the sticky unit, hex-encoded (`,hex`, upper case), `-` when the request had none,
  so any bytes a header carries stay one unambiguous field; then `.`, the end mark:
  a line HAProxy truncated (`log … len`) lacks it and is refused, not misread.
"""

from __future__ import annotations

from typing import Final

from routers.haproxy.vars import EXPERIMENT, SALT, TOKEN, UNIT, VARIANT
from routers.samples.lines import MAX_LINE

TAG: Final = "cx3"
END: Final = "."
FIELDS: Final = (
    "tag", "token", "service", "experiment", "salt", "variant", "status", "ta", "tr_req", "tw",
    "tc", "tr", "tt", "accept", "termination", "unit", "end",
)  # fmt: skip
# MAX_LINE is also the longest line HAProxy is told to send (`log … len`); the unit
# is bounded in the config (render.MAX_UNIT) so that its hex fits well within it


def log_format(service: str) -> str:
    """The `log-format` value for a frontend of `service` (a ServiceName, no quoting)."""
    return " ".join(
        (
            TAG,
            f"%[var({TOKEN})]",
            service,
            f"%[var({EXPERIMENT})]",
            f"%[var({SALT})]",
            f"%[var({VARIANT})]",
            "%ST %Ta %TR %Tw %Tc %Tr %Tt %Ts.%ms %ts",
            f"%[var({UNIT}),hex]",
            END,
        )
    )


__all__ = ["END", "FIELDS", "MAX_LINE", "TAG", "log_format"]
