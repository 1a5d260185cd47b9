"""Draftsmith: the command-line entry point that composes the trainer, the API and the worker, and the
Python client of the service (`from draftsmith import Client`)."""

__version__ = "0.1.0"
__all__ = ["ApiError", "Client", "__version__"]


def __getattr__(name: str):  # the client loads httpx only when asked for, not on every CLI command
    if name in ("Client", "ApiError"):
        from draftsmith import client

        return getattr(client, name)
    raise AttributeError(name)
