"""The domain of the control plane: what a job, an audit, a drafter and an organisation's limits mean, and the
database they live in (models, states, jobs, audits, drafters, usage, secrets, webhooks, storage and its tenancy
scope, shards, the queue, and `runs`: the stage runs the worker reports through).

Plain Python, importable by the API, the worker and the CLI alike; it never imports FastAPI, Starlette,
the HTTP layer (`api/`), the worker, `migrations` or torch (tests/test_layout.py). Not `control/`, the name the
house plan first gave it (docs/ARCHITECTURE.md): that name is kombu's filesystem-broker folder, ignored by .gitignore.
"""
