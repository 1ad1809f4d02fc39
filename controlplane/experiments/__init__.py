"""Experiments: their lifecycle and the actions that drive it."""
