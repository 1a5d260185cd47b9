"""/v1/files: upload a prompts file (validated before anything is stored), list, get."""

from __future__ import annotations

import hashlib
import re
from typing import Annotated, Literal

from fastapi import APIRouter, File, Form, UploadFile
from sqlalchemy import select

from api.deps import ReadPrincipal, ServicesDep, SessionDep, WritePrincipal
from domain.models import PromptFile, new_id, utcnow
from domain.errors import FieldError, InvalidRequest, NotFound
from api.problems import PayloadTooLarge, problem_responses
from api.schemas import FileList, FileOut
from schemas.prompts import validate_prompt_bytes

router = APIRouter(prefix="/v1/files", tags=["files"])
_UNSAFE_FILENAME_CHARS = re.compile(r"[^A-Za-z0-9._ -]")


def _safe_filename(raw: str | None) -> str:
    # Only for display: keep the last path component, replace anything unusual.
    name = (raw or "prompts.jsonl").replace("\\", "/").rsplit("/", 1)[-1]
    return _UNSAFE_FILENAME_CHARS.sub("_", name).strip()[:255] or "prompts.jsonl"


def _file_out(row: PromptFile) -> FileOut:
    return FileOut(id=row.id, filename=row.filename, purpose=row.purpose, bytes=row.size_bytes,  # type: ignore[arg-type]
                   sha256=row.sha256, prompt_count=row.prompt_count, created_at=row.created_at)


@router.post(
    "",
    status_code=201,
    response_model=FileOut,
    summary="Upload a prompts file (JSONL)",
    description='One JSON object per line: `{"messages": [{"role": "user", "content": "..."}]}` or '
    '`{"prompt": "..."}`. The whole file is validated first; a bad file answers 422 with the line '
    "numbers at fault and nothing is stored. Larger than DRAFTSMITH_MAX_UPLOAD_BYTES answers 413. "
    "Reference the returned id as `data.source` in a job.",
    responses=problem_responses(401, 403, 413, 422),
)
def upload(
    principal: WritePrincipal,
    session: SessionDep,
    services: ServicesDep,
    file: Annotated[UploadFile, File(description="The JSONL prompts file.")],
    purpose: Annotated[Literal["prompts"], Form()] = "prompts",
) -> FileOut:
    limit = services.settings.max_upload_bytes
    # The request-size middleware already bounded the body; this is the exact per-file limit.
    data = file.file.read(limit + 1)
    if len(data) > limit:
        raise PayloadTooLarge(
            f"the file is larger than the {limit}-byte limit; split it into several files",
            errors=[FieldError(field="file", message=f"larger than {limit} bytes")],
        )
    report = validate_prompt_bytes(data)
    if not report.valid:
        errors = [FieldError(field="file", line=e.line, message=e.message) for e in report.errors]
        more = " (more errors not shown)" if report.truncated else ""
        first = report.errors[0]
        raise InvalidRequest(f"line {first.line}: {first.message}{more}", errors=errors)
    file_id = new_id("file-")
    key = f"files/{principal.org_id}/{file_id}.jsonl"
    stored = services.storage.put_bytes(key, data)
    row = PromptFile(
        id=file_id, org_id=principal.org_id, filename=_safe_filename(file.filename), purpose=purpose,
        size_bytes=stored.size_bytes, sha256=hashlib.sha256(data).hexdigest(), prompt_count=report.prompt_count,
        storage_key=key, created_at=utcnow(),
    )
    session.add(row)
    try:
        session.commit()
    except Exception:
        services.storage.delete(key)  # no orphaned bytes without a row
        raise
    return _file_out(row)


@router.get("", response_model=FileList, summary="List uploaded files", responses=problem_responses(401, 403))
def list_files(principal: ReadPrincipal, session: SessionDep) -> FileList:
    rows = session.scalars(
        select(PromptFile).where(PromptFile.org_id == principal.org_id).order_by(PromptFile.id.desc()).limit(1000)
    )
    return FileList(data=[_file_out(row) for row in rows])


@router.get("/{file_id}", response_model=FileOut, summary="Get an uploaded file's metadata",
            responses=problem_responses(401, 403, 404))
def get_file(principal: ReadPrincipal, session: SessionDep, file_id: str) -> FileOut:
    row = session.scalar(select(PromptFile).where(PromptFile.id == file_id, PromptFile.org_id == principal.org_id))
    if row is None:
        raise NotFound(f"no file {file_id!r} in your organisation")
    return _file_out(row)
