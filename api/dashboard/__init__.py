"""The web dashboard: a single page (plain HTML and JavaScript modules, no build step) that the API
serves at `/`, driving the same `/v1` endpoints as every other client. See router.py."""

from api.dashboard.router import router

__all__ = ["router"]
