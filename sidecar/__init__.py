"""The sidecar: a reverse proxy next to a service that assigns, forwards, times and tags."""

from sidecar import compiled

# before any module of the proxy is imported: compiled or pure Python, not a mix
compiled.select()
