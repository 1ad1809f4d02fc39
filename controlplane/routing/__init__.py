"""Route tables for the sidecars: building and publishing them to the KV store."""
