"""Adaptive overload protection: a concurrency limit per upstream learned from its
latency (`limit`), graded shedding by priority (`levels`), admission with a short
FIFO queue in the proxy (`gate`), and its configuration from etcd (`config`)."""
