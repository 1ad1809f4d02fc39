"""The `canary` CLI's side of the REST API: an HTTP client and the file loaders."""
