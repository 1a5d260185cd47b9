"""Uploaded prompts files: the rows of `files` and their bytes in object storage.

`POST /v1/files` validates a JSONL file whole before anything is stored (schemas/prompts.py; the route answers 422
or 413), then `store_prompt_file` writes the bytes under `files/<org>/<id>.jsonl` and the row beside them. A job or
an audit names an upload by its id as `data.source`: admission counts its prompts (`uploaded_prompt_count`), the
worker reads it through `uploaded_prompts_key`. Every lookup is scoped to the organisation, so another
organisation's id reads as a missing one.
"""

from __future__ import annotations

import hashlib
import re

from sqlalchemy import select
from sqlalchemy.orm import Session

from domain.errors import FieldError, InvalidRequest, NotFound
from domain.models import PromptFile, new_id, utcnow
from domain.storage import LocalStorage, S3Storage

FILE_ID_PREFIX = "file-"
LIST_LIMIT = 1000
_UNSAFE_FILENAME_CHARS = re.compile(r"[^A-Za-z0-9._ -]")


def safe_filename(raw: str | None) -> str:
    """The name shown for an upload. Only for display: keep the last path component, replace anything unusual."""
    name = (raw or "prompts.jsonl").replace("\\", "/").rsplit("/", 1)[-1]
    return _UNSAFE_FILENAME_CHARS.sub("_", name).strip()[:255] or "prompts.jsonl"


def store_prompt_file(session: Session, storage: LocalStorage | S3Storage, *, org_id: str, filename: str | None,
                      purpose: str, data: bytes, prompt_count: int) -> PromptFile:
    """Store an already validated prompts file: its bytes, then its row (committed). A failed commit deletes the
    bytes again, so no object is left without a row."""
    file_id = new_id(FILE_ID_PREFIX)
    key = f"files/{org_id}/{file_id}.jsonl"
    stored = storage.put_bytes(key, data)
    row = PromptFile(
        id=file_id, org_id=org_id, filename=safe_filename(filename), purpose=purpose,
        size_bytes=stored.size_bytes, sha256=hashlib.sha256(data).hexdigest(), prompt_count=prompt_count,
        storage_key=key, created_at=utcnow(),
    )
    session.add(row)
    try:
        session.commit()
    except Exception:
        storage.delete(key)  # no orphaned bytes without a row
        raise
    return row


def prompt_files_of(session: Session, org_id: str) -> list[PromptFile]:
    """The organisation's uploads, newest first (at most `LIST_LIMIT`)."""
    return list(session.scalars(
        select(PromptFile).where(PromptFile.org_id == org_id).order_by(PromptFile.id.desc()).limit(LIST_LIMIT)
    ))


def prompt_file_for_org(session: Session, org_id: str, file_id: str) -> PromptFile:
    """One of the organisation's uploads, or 404 (another organisation's id too)."""
    row = session.scalar(select(PromptFile).where(PromptFile.id == file_id, PromptFile.org_id == org_id))
    if row is None:
        raise NotFound(f"no file {file_id!r} in your organisation")
    return row


def uploaded_prompt_count(session: Session, org_id: str, file_id: str) -> int:
    """The prompts in one of the organisation's uploaded files; 422 naming data.source when it has no such file."""
    count = session.scalar(select(PromptFile.prompt_count).where(PromptFile.id == file_id,
                                                                 PromptFile.org_id == org_id))
    if count is None:
        message = f"no uploaded file {file_id!r} in your organisation; upload one with POST /v1/files"
        raise InvalidRequest(message, errors=[FieldError(field="data.source", message=message)])
    return int(count)


def uploaded_prompts_key(session: Session, org_id: str, source: str) -> str | None:
    """Where the worker reads an uploaded `data.source` (its storage key), or None: not an upload's id
    (`file-...`), or not one of the organisation's."""
    if not source.startswith(FILE_ID_PREFIX):
        return None
    return session.scalar(select(PromptFile.storage_key).where(PromptFile.id == source,
                                                               PromptFile.org_id == org_id))
