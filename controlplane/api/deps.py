"""Dependencies of the routes, as Annotated aliases.

Settings come from one cached dependency (read once from the environment) that
`create_app` and tests override; the open backends live on the app's state, put
there by the lifespan.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Annotated

from fastapi import Depends, Path, Query, Request

from controlplane.db.session import Database
from controlplane.experiments.store import ExperimentStore
from controlplane.kernel.clock import Clock
from controlplane.kernel.errors import BackendUnavailable
from controlplane.kernel.keys import EtcdKeys
from controlplane.kernel.settings import Settings
from controlplane.kernel.values import SQL_ID_MAX, SQL_INT_MAX
from controlplane.runtime import Backends


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()


def get_backends(request: Request) -> Backends:
    backends: Backends | None = getattr(request.app.state, "backends", None)
    if backends is None:
        raise BackendUnavailable("the backends are not open (starting up or shutting down)")
    return backends


def get_database(backends: BackendsDep) -> Database:
    return backends.database


def get_store(backends: BackendsDep) -> ExperimentStore:
    return backends.store


def get_keys(backends: BackendsDep) -> EtcdKeys:
    return backends.keys


def get_clock(backends: BackendsDep) -> Clock:
    return backends.clock


SettingsDep = Annotated[Settings, Depends(get_settings)]
BackendsDep = Annotated[Backends, Depends(get_backends)]
DatabaseDep = Annotated[Database, Depends(get_database)]
StoreDep = Annotated[ExperimentStore, Depends(get_store)]
KeysDep = Annotated[EtcdKeys, Depends(get_keys)]
ClockDep = Annotated[Clock, Depends(get_clock)]
Limit = Annotated[int, Query(ge=1, le=500, description="page size")]
Offset = Annotated[int, Query(ge=0, le=SQL_INT_MAX, description="items to skip")]
# Any integer is a well-formed id: one outside the SQL range names no row, so it is a
# 404 (raised by the lookup), not a 422 about bounds. The schema still states them.
ExperimentId = Annotated[
    int,
    Path(
        description="experiment id",
        json_schema_extra={"minimum": 1, "maximum": SQL_ID_MAX},
    ),
]
