"""Draftsmith control plane's HTTP edge: the FastAPI app (`api.main:app`), its routes, auth, admission and
problems, the web dashboard, and the `draftsmith api|db|keys` commands. The domain it serves lives in `domain/`.

Imports flow one way: `api` uses `domain` and `schemas` and never imports `worker`, `trainer` or torch.
"""
