"""`canary dev` on local backends that data planes can join (decision 0053)."""
