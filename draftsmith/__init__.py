"""Draftsmith: the command-line entry point that composes the trainer, the API and the worker."""

__version__ = "0.1.0"
