"""/healthz (the process answers) and /readyz (its database and etcd answer)."""

from __future__ import annotations

from typing import Any

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from controlplane.api.problems import problem_responses
from controlplane.api.security import public
from controlplane.kernel.errors import CanaryError

# probes must answer without credentials; they tell nothing but up or not
router = APIRouter(tags=["health"], dependencies=[public()])

CHECK_TIMEOUT_SEC = 2.0

# /readyz answers 503 with its own JSON body (the checks), which probes read
READYZ: dict[int | str, dict[str, Any]] = {
    **problem_responses(),
    503: {
        "description": "a backend does not answer",
        "content": {"application/json": {"schema": {"type": "object"}}},
    },
}


@router.get("/healthz", responses=problem_responses())
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", responses=READYZ)
async def readyz(request: Request) -> JSONResponse:
    backends = getattr(request.app.state, "backends", None)
    if backends is None:
        return JSONResponse({"status": "starting", "checks": {}}, status_code=503)
    checks: dict[str, str] = {}
    for name, ping in (("database", backends.database.ping), ("etcd", backends.kv.ping)):
        try:
            with anyio.fail_after(CHECK_TIMEOUT_SEC):
                await ping()
            checks[name] = "ok"
        except TimeoutError:
            checks[name] = f"no answer within {CHECK_TIMEOUT_SEC} s"
        except CanaryError as exc:
            checks[name] = str(exc)
    ready = all(v == "ok" for v in checks.values())
    return JSONResponse(
        {"status": "ready" if ready else "unavailable", "checks": checks},
        status_code=200 if ready else 503,
    )
