"""Alembic migrations for the Draftsmith database (PostgreSQL and SQLite share them).

Run them explicitly: `draftsmith db upgrade` / `draftsmith db downgrade` (see migrations/revisions.py),
or `alembic -c migrations/alembic.ini upgrade head` from a checkout.
"""
