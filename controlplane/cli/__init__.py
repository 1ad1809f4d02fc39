"""The `canary` command line: one module per command group, registered in main."""
