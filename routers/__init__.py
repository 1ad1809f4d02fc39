"""Traffic routers: the data planes the controller's routes steer (architecture §4, §9).

Our sidecar (`sidecar/`) is one; `routers/` holds the agents that steer proxies teams
already run, NGINX and HAProxy, through the same etcd route a sidecar watches, and
turn those proxies' access logs into the same samples.
"""
