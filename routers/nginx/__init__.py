"""NGINX as a canary data plane: a route becomes one include file nginx reloads.

    render.py      Route → the include text (upstreams, unit maps, split_clients, the
                   service's server, a loopback status server)          pure
    split.py       nginx's MurmurHash2 and split_clients thresholds: which variant
                   nginx gives a unit                                   pure
    log_format.py  the JSON access-log line, one place
    log_lines.py   those datagrams → samples (a LineParser)
    router.py      NginxRouter: render, `nginx -t`, swap, reload, confirm
    workers.py     which workers of a master still accept (Linux /proc)

What the operator provides: a main config whose `http {}` includes the router's file
(`include /etc/nginx/canary/<service>.conf;`), the pid file of the master, a free
loopback port for the status server, and the log receiver's UDP address. nginx
speaks HTTP/1.x to upstreams, so a route with an h2c:// or h2:// upstream is refused;
https:// upstreams are verified against `trusted_ca`. Upstream host names are
resolved when nginx loads the config (at each reload), not per request.
"""
