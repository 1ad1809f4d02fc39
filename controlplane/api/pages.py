"""The dashboard and the API docs: static pages served by the API itself.

    /ui/                          experiments list (static/index.html)
    /ui/experiments/{id}          one experiment (static/experiment.html)
    /ui/static/...                their scripts, styles and vendored libraries
    /docs                         Swagger UI on the package's own copy
    /favicon.ico                  the pages' icon (static/favicon.svg), where browsers look

The pages hold no data: their scripts call the API with the bearer token the user
signed in with (kept in sessionStorage, sent in the Authorization header), so no
ambient credential exists for a forged request to ride on. Nothing is loaded from
another origin, so they work where there is no internet (decision 0022).
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import FileResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).resolve().parent / "static"
UI_PREFIX = "/ui"
STATIC_PATH = f"{UI_PREFIX}/static"
SWAGGER_PATH = f"{UI_PREFIX}/swagger-ui"
DOCS_PATH = "/docs"
FAVICON_PATH = "/favicon.ico"


def dashboard_url(base: str) -> str:
    """Where a browser opens the dashboard of the API at `base` (http://host:port)."""
    return f"{base.rstrip('/')}{UI_PREFIX}/"


def _page(name: str) -> object:
    path = STATIC_DIR / name

    async def serve(request: Request) -> Response:
        return FileResponse(path, media_type="text/html; charset=utf-8")

    serve.__name__ = f"page_{name.split('.')[0]}"
    return serve


async def _to_list(request: Request) -> Response:
    return RedirectResponse(f"{UI_PREFIX}/", status_code=308)


async def _favicon(request: Request) -> Response:
    # the pages name the SVG in <link rel=icon>; a browser opening an API URL asks here
    return FileResponse(STATIC_DIR / "favicon.svg", media_type="image/svg+xml")


def install(app: FastAPI) -> list[str]:
    """Add the pages to `app` (built with docs_url=None); the paths, all public."""
    routes = [
        Route(UI_PREFIX, _to_list, methods=["GET", "HEAD"]),
        Route(f"{UI_PREFIX}/", _page("index.html"), methods=["GET", "HEAD"]),  # type: ignore[arg-type]
        Route(
            f"{UI_PREFIX}/experiments/{{experiment_id:int}}",
            _page("experiment.html"),  # type: ignore[arg-type]
            methods=["GET", "HEAD"],
        ),
        Route(DOCS_PATH, _page("docs.html"), methods=["GET", "HEAD"]),  # type: ignore[arg-type]
        Route(FAVICON_PATH, _favicon, methods=["GET", "HEAD"]),
    ]
    app.router.routes.extend(routes)
    # Swagger UI's files come from an installed package (fastapi-offline ships them),
    # not copied into this tree, and nothing is fetched at run time
    swagger = importlib.resources.files("fastapi_offline") / "static"
    app.mount(SWAGGER_PATH, StaticFiles(directory=str(swagger)), name="ui-swagger")
    app.mount(STATIC_PATH, StaticFiles(directory=STATIC_DIR), name="ui-static")
    return [r.path for r in routes] + [SWAGGER_PATH, STATIC_PATH]
