"""Routes for the sidecars: building one from an experiment, and the wake-up after a
committed change (the leader's reconciler in controller/ writes them to etcd)."""
