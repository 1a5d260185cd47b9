"""Draftsmith control plane: the FastAPI app (`api.main:app`), its database models, the stage-runner
API the worker reports through, and the `draftsmith api|db|keys` commands.

Imports flow one way: `api` uses `schemas` and never imports `worker`, `trainer` or torch.
"""
