"""The domain of the control plane: what a job, an audit, a drafter and an organisation's limits mean.

Plain Python, importable by the API, the worker and the CLI alike; it never imports FastAPI, Starlette,
the HTTP layer (`api/`), the worker or torch (tests/test_layout.py). It grows as the house plan
(../shared/HOUSE_PLAN.md, which calls it `control/`: that name is
kombu's filesystem-broker folder, ignored by .gitignore) moves the core out of `api/`; today it holds the domain's errors.
"""
