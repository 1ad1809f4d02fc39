"""The shared kernel: settings, schemas, codecs, clocks and backend adapters.

Nothing here imports FastAPI or SQLAlchemy, so a sidecar can start from it alone.
"""
