"""Metric providers: evidence per variant from systems teams already run (decision 0048)."""
