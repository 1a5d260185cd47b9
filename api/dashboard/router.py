"""Serves the dashboard: `/` (the page), `/assets/...` (its files) and short-lived download links.

Files come from two package folders, read with importlib.resources so an installed package serves
them too (pyproject's package-data lists both):
- `api/dashboard/static/`: the page, its styles and its JavaScript modules;
- `report/static/`: the chart code, the vendored uPlot and report.json's JSON Schema, shared with the
  offline report.html that the trainer's export writes (`report/` is a leaf both may read; see
  report/static/README.md), served under `/assets/shared/`.

Nothing here is in the OpenAPI document: these are the dashboard's own files, not the API.
Every page response carries a strict Content-Security-Policy (scripts and connections to this
origin only), because the page holds an API key in the browser session.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, Response

from api.dashboard.downloads import router as downloads_router
from domain.errors import NotFound

router = APIRouter(include_in_schema=False)
router.include_router(downloads_router)

DASHBOARD_STATIC = Path(str(resources.files("api.dashboard").joinpath("static")))
SHARED_STATIC = Path(str(resources.files("report").joinpath("static")))
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".json": "application/json",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
}
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # Revalidate on every load: after an upgrade the page and its modules change together.
    "Cache-Control": "no-cache",
}


def _resolve(root: Path, name: str) -> Path:
    """The file `name` inside `root`, or 404: no traversal, no hidden files, known types only."""
    parts = name.split("/")
    if not name or "\\" in name or any(part in ("", ".", "..") or part.startswith(".") for part in parts):
        raise NotFound(f"no dashboard asset {name!r}")
    path = (root / name).resolve()
    if not path.is_relative_to(root.resolve()) or not path.is_file() or path.suffix not in CONTENT_TYPES:
        raise NotFound(f"no dashboard asset {name!r}")
    return path


def _file(path: Path) -> FileResponse:
    return FileResponse(path, media_type=CONTENT_TYPES[path.suffix], headers=SECURITY_HEADERS)


@router.get("/")
def index() -> Response:
    return _file(_resolve(DASHBOARD_STATIC, "index.html"))


@router.get("/assets/shared/{name:path}")
def shared_asset(name: str) -> Response:
    return _file(_resolve(SHARED_STATIC, name))


@router.get("/assets/{name:path}")
def dashboard_asset(name: str) -> Response:
    return _file(_resolve(DASHBOARD_STATIC, name))
