"""History for the dashboard's plots: one point per experiment and second, from the
windows the controller judges (decision 0022)."""
