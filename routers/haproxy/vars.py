"""The HAProxy transaction variables the base config and its log format share."""

from __future__ import annotations

from typing import Final

ROUTE: Final = "txn.cx_route"  # the map's one route value, read once per request
EXPERIMENT: Final = "txn.cx_exp"
SALT: Final = "txn.cx_salt"
UNIT: Final = "txn.cx_unit"
BUCKET: Final = "txn.cx_bucket"
VARIANT: Final = "txn.cx_variant"
TOKEN: Final = "txn.cx_token"  # the agent's log token, from the route value
