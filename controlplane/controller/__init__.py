"""The controller: the only writer of routes, run by the elected control-plane leader."""
