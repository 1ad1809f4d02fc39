"""The sidecar: a reverse proxy next to a service that assigns, forwards, times and tags."""
