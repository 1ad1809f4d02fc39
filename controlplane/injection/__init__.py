"""`canary inject`: the sidecar added to a workload's Pod, and its Service pointed at it
(decision 0055). `sidecar_container` says what the container is, `inject` rewrites
the documents (pure), `manifests` reads, checks and writes the YAML."""
