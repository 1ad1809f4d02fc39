"""canary control plane: API, controller, collector and the shared kernel."""
