"""The sidecar on every core: a supervisor and its worker processes (decision 0020).

    supervisor ── spawns N ──► worker 0 … worker N-1   (python -m sidecar.workers.worker)
       │  admin: /healthz /readyz /metrics             each: proxy on the shared port,
       │  reads each worker's admin Unix socket        its own route watcher, reporter
       └─ restarts a crashed worker, forwards SIGTERM  and admin socket

`policy` decides (how many workers, when to restart), `listeners` reserves the port,
`spec` is what a worker is told, `worker` runs one, `scrape` and `aggregate` read and
merge the workers' metrics, `supervisor` runs them all.
"""
