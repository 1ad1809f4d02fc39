"""The HAProxy router: canary's routes put in force in HAProxy 2.6 with no reload.

An operator renders a base config once per service (`render.py`: a frontend, one
backend per declared variant, an empty map, an admin stats socket, an access log
to the UDP receiver) and starts HAProxy with it. From then on `HaproxyRouter`
(`router.py`) applies each route through the stats socket (`runtime.py`): servers
addressed and made ready, then the whole route committed as one map version, read
back, and unused servers parked (`plan.py`, `route_value.py`). HAProxy assigns each
request as `split.py` predicts (xxh32 of "<salt>:<unit>" mod 10000, the sidecar's
bucket layout) and logs one line per request (`log_format.py`) that `log_lines.py`
turns into a sample.

What the base config fixes, and a route cannot change: the declared variants, the
sticky header and cookie names, whether `x-canary-force` is honoured, and plain
http:// upstreams without a path prefix. A route that needs more is refused with a
RouterError saying so; the route in force stays.
"""
