"""Organisation secrets: credentials an organisation stores once and jobs reference by name
(`publish[].credentials_secret`, `publish[].token_secret`) or by convention: `s3.<bucket>` / `s3` for its buckets
(domain/storage_scope.py), `hf.<namespace>` / `hf` for the Hub (both domain/storage_scope.py). Job bodies never carry secret
values.

Values are encrypted at rest with Fernet (AES-128-CBC + HMAC-SHA256) under a key derived from
`DRAFTSMITH_SECRETS_KEY`, or from `DRAFTSMITH_SECRET_KEY` when that is unset. The API writes them and never
reads them back out; the worker decrypts one when it fetches or publishes. Neither the value nor a fragment of it
ever appears in a response, an event or a log line.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from typing import cast

from cryptography.fernet import Fernet, InvalidToken
from sqlalchemy import Table, select
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from domain.errors import FieldError, InvalidRequest, NotFound
from domain.models import OrgSecret, utcnow
from domain.settings import Settings
from domain.storage_scope import s3_secret_problems
from schemas.job_spec import SECRET_NAME_PATTERN, JobSpec

MAX_SECRET_BYTES = 16 * 1024
_NAME_RE = re.compile(SECRET_NAME_PATTERN)


class SecretUnavailable(Exception):
    """A referenced secret is missing or cannot be decrypted (the encryption key changed). The message names
    the secret, never its value."""


def _fernet(settings: Settings) -> Fernet:
    source = settings.secrets_key or settings.secret_key
    digest = hashlib.sha256(b"draftsmith/org-secrets/v1\0" + source.get_secret_value().encode()).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


def check_name(name: str) -> str:
    if not _NAME_RE.match(name):
        raise InvalidRequest("a secret name is 1-63 characters of a-z, 0-9, '_', '.', '-', starting with a letter "
                             "or digit", errors=[FieldError(field="name", message="invalid secret name")])
    return name


def put_secret(session: Session, settings: Settings, org_id: str, name: str, value: str) -> OrgSecret:
    check_name(name)
    if not value or len(value.encode()) > MAX_SECRET_BYTES:
        raise InvalidRequest(f"a secret value is 1 to {MAX_SECRET_BYTES} bytes",
                             errors=[FieldError(field="value", message=f"1 to {MAX_SECRET_BYTES} bytes")])
    check_s3_secret_value(settings, value)
    ciphertext = _fernet(settings).encrypt(value.encode()).decode()
    # One statement, decided by the database: concurrent PUTs of one name each store or replace it (the last
    # wins), instead of two inserts racing into the primary key (20 concurrent PUTs of one name gave two 500s).
    now = utcnow()
    table = cast(Table, OrgSecret.__table__)  # declared as a FromClause; a mapped class's table is a Table
    insert = postgresql_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert
    statement = insert(table).values(org_id=org_id, name=name, ciphertext=ciphertext, created_at=now, updated_at=now)
    session.execute(statement.on_conflict_do_update(index_elements=[table.c.org_id, table.c.name],
                                                    set_={"ciphertext": ciphertext, "updated_at": now}))
    session.commit()
    # (Deleted again in between by a concurrent DELETE: report what this request stored.)
    return session.get(OrgSecret, (org_id, name), populate_existing=True) or OrgSecret(
        org_id=org_id, name=name, ciphertext=ciphertext, created_at=now, updated_at=now)


def check_s3_secret_value(settings: Settings, value: str) -> None:
    """A value that is a JSON object is S3 credentials (a Hub token never is): refused now (422 naming
    `value.<field>` and the fix) when the worker would refuse it before every use (domain/storage_scope.py
    `s3_secret_problems`: above all an endpoint that reaches Draftsmith's own storage, which would let an
    organisation's credentials read or write other organisations' files)."""
    try:
        given = json.loads(value)
    except ValueError:
        return
    if not isinstance(given, dict):
        return
    errors = [FieldError(field=f"value.{field}", message=message)
              for field, message in s3_secret_problems(given, settings)]
    if errors:
        raise InvalidRequest(f"{errors[0].field}: {errors[0].message}", errors=errors)


def list_secrets(session: Session, org_id: str) -> list[OrgSecret]:
    return list(session.scalars(select(OrgSecret).where(OrgSecret.org_id == org_id).order_by(OrgSecret.name)))


def delete_secret(session: Session, org_id: str, name: str) -> None:
    row = session.get(OrgSecret, (org_id, check_name(name)))
    if row is None:
        raise NotFound(f"no secret {name!r} in your organisation")
    session.delete(row)
    session.commit()


def secret_value(session: Session, settings: Settings, org_id: str, name: str) -> str:
    """The decrypted value, for the worker only (a fetch or a publish with the organisation's own credentials)."""
    row = session.get(OrgSecret, (org_id, name))
    if row is None:
        raise SecretUnavailable(f"organisation secret {name!r} does not exist; store it with PUT /v1/secrets/{name}")
    try:
        return _fernet(settings).decrypt(row.ciphertext.encode()).decode()
    except InvalidToken:
        raise SecretUnavailable(f"organisation secret {name!r} cannot be decrypted with this deployment's key "
                                "(DRAFTSMITH_SECRETS_KEY changed?); store it again") from None


def parse_s3_credentials(raw: str, name: str) -> dict[str, str | None]:
    """An S3 secret's JSON as s3_client's keyword arguments; SecretUnavailable naming the secret (never its value)
    when it is not {"access_key_id", "secret_access_key", "endpoint_url"?, "region"?}."""
    try:
        given = json.loads(raw)
        return {"access_key_id": str(given["access_key_id"]), "secret_access_key": str(given["secret_access_key"]),
                "endpoint_url": given.get("endpoint_url"), "region": given.get("region")}
    except (ValueError, KeyError, TypeError, AttributeError):
        raise SecretUnavailable(f"secret {name!r} must be JSON with access_key_id and secret_access_key (optionally "
                                "endpoint_url, region)") from None


def parse_hub_token(raw: str, name: str) -> str:
    """A Hub secret's value is the token itself; surrounding whitespace (a pasted newline) is not part of it."""
    token = raw.strip()
    if not token or any(char.isspace() for char in token):
        raise SecretUnavailable(f"secret {name!r} must hold one Hub token (hf_...), without spaces or line breaks")
    return token


def check_referenced_secrets(session: Session, org_id: str, spec: JobSpec) -> None:
    """Refuse a job naming a secret the organisation has not stored, before anything runs."""
    known = {row.name for row in list_secrets(session, org_id)}
    errors = []
    for index, destination in enumerate(spec.publish):
        field = "credentials_secret" if destination.kind == "s3" else "token_secret"
        name = getattr(destination, field)
        if name is not None and name not in known:
            errors.append(FieldError(field=f"publish.{index}.{field}",
                                     message=f"no secret {name!r} in your organisation; create it with "
                                     f"PUT /v1/secrets/{name}"))
    if errors:
        raise InvalidRequest(f"{errors[0].field}: {errors[0].message}", errors=errors)
