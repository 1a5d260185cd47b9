"""Pure-pydantic schemas shared by the API, the worker and the trainer.

Nothing here imports torch, FastAPI or SQLAlchemy, so the API can validate a job spec
without loading the ML stack.
"""
