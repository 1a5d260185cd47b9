"""/v1/files: upload a prompts file (validated before anything is stored), list, get."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, File, Form, UploadFile

from api.deps import ReadPrincipal, ServicesDep, SessionDep, WritePrincipal
from api.problems import PayloadTooLarge, problem_responses
from api.schemas import FileList, FileOut
from domain.errors import FieldError, InvalidRequest
from domain.files import prompt_file_for_org, prompt_files_of, store_prompt_file
from domain.models import PromptFile
from schemas.prompts import validate_prompt_bytes

router = APIRouter(prefix="/v1/files", tags=["files"])


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
    row = store_prompt_file(session, services.storage, org_id=principal.org_id, filename=file.filename,
                            purpose=purpose, data=data, prompt_count=report.prompt_count)
    return _file_out(row)


@router.get("", response_model=FileList, summary="List uploaded files", responses=problem_responses(401, 403))
def list_files(principal: ReadPrincipal, session: SessionDep) -> FileList:
    return FileList(data=[_file_out(row) for row in prompt_files_of(session, principal.org_id)])


@router.get("/{file_id}", response_model=FileOut, summary="Get an uploaded file's metadata",
            responses=problem_responses(401, 403, 404))
def get_file(principal: ReadPrincipal, session: SessionDep, file_id: str) -> FileOut:
    return _file_out(prompt_file_for_org(session, principal.org_id, file_id))
