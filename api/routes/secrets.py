"""/v1/secrets: an organisation's publishing credentials. Write-only: values go in, only names come out."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Path, Response
from pydantic import BaseModel, Field

from api.deps import AdminPrincipal, ServicesDep, SessionDep
from api.problems import problem_responses
from domain.models import OrgSecret
from domain.secrets import MAX_SECRET_BYTES, delete_secret, list_secrets, put_secret
from schemas.bounds import JsonBody
from schemas.job_spec import SECRET_NAME_PATTERN

router = APIRouter(prefix="/v1/secrets", tags=["secrets"])


class SecretIn(JsonBody):
    value: str = Field(min_length=1, max_length=MAX_SECRET_BYTES,
                       description='The credential: a Hub token, or for S3 a JSON object {"access_key_id", '
                       '"secret_access_key", "endpoint_url"?, "region"?}. Never shown again.')


class SecretOut(BaseModel):
    object: Literal["secret"] = "secret"
    name: str
    created_at: datetime
    updated_at: datetime


class SecretList(BaseModel):
    object: Literal["list"] = "list"
    data: list[SecretOut]


# The rule domain/secrets.py enforces (with its own message), stated in the OpenAPI document.
SecretName = Annotated[str, Path(description="1-63 characters of a-z, 0-9, '_', '.', '-', starting with a letter or "
                                 "digit", json_schema_extra={"pattern": SECRET_NAME_PATTERN})]


def _out(row: OrgSecret) -> SecretOut:
    return SecretOut(name=row.name, created_at=row.created_at, updated_at=row.updated_at)


@router.put("/{name}", response_model=SecretOut, summary="Store or replace a secret",
            description="Jobs reference it by name in `publish[].credentials_secret` / `token_secret`. Encrypted "
            "at rest; the value is never returned, logged or put in events.",
            responses=problem_responses(401, 403, 422))
def store(name: SecretName, body: SecretIn, principal: AdminPrincipal, session: SessionDep,
          services: ServicesDep) -> SecretOut:
    return _out(put_secret(session, services.settings, principal.org_id, name, body.value))


@router.get("", response_model=SecretList, summary="List the organisation's secrets (names only)",
            responses=problem_responses(401, 403))
def index(principal: AdminPrincipal, session: SessionDep) -> SecretList:
    return SecretList(data=[_out(row) for row in list_secrets(session, principal.org_id)])


@router.delete("/{name}", status_code=204, summary="Delete a secret", responses=problem_responses(401, 403, 404, 422))
def remove(name: SecretName, principal: AdminPrincipal, session: SessionDep) -> Response:
    delete_secret(session, principal.org_id, name)
    return Response(status_code=204)
