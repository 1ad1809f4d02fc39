"""`canary demo`: the whole story in one process on the embedded backends.

upstreams (v1, v2, v3) ◄── sidecar ◄── load generator (~200 requests/s, many users)
the collector, the API with its controller, and two scenarios driven through the
REST API as a release manager would: a healthy canary promoted, a degraded one
rolled back.
"""
