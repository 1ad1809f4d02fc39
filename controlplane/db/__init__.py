"""SQL persistence: typed models, the engine factory and data-access functions."""
