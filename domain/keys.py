"""The API-key store: organisations, their keys and scopes.

A key is `dsk_` + 43 random URL-safe characters (256 bits), shown once at creation. The database
keeps only HMAC-SHA256(secret_key, key): a leaked table cannot be turned back into keys, nor
checked against guesses without the deployment's secret. Scopes nest: admin ⊃ write ⊃ read.

api/auth.py reads the `Authorization` header and turns a key found here into its Principal; `draftsmith keys`
(api/cli.py) and the test harnesses create keys with `create_api_key`.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import Row, bindparam, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from domain.models import ApiKey, Organisation, utcnow
from domain.settings import Settings

KEY_PREFIX = "dsk_"
SCOPES = ("read", "write", "admin")
SCOPE_RANK = {scope: rank for rank, scope in enumerate(SCOPES)}
LAST_USED_RESOLUTION = timedelta(minutes=1)  # don't write on every request just to say "still used"


@dataclass(frozen=True)
class IssuedKey:
    key_id: str
    org_id: str
    plaintext: str  # shown once; never stored
    scopes: tuple[str, ...]


def hash_key(plaintext: str, settings: Settings) -> str:
    return hmac.new(settings.secret_key.get_secret_value().encode(), plaintext.encode(), hashlib.sha256).hexdigest()


def normalize_scopes(scopes: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    unknown = [s for s in scopes if s not in SCOPES]
    if unknown or not scopes:
        raise ValueError(f"scopes must be a non-empty subset of {', '.join(SCOPES)}; got {', '.join(scopes) or 'none'}")
    return tuple(sorted(set(scopes), key=SCOPE_RANK.__getitem__))


ORGANISATION_LIMITS = ("max_concurrent_jobs", "monthly_compute_seconds", "monthly_tokens_generated",
                       "monthly_tokens_trained")
"""The limits an organisation's row may set for itself (None: the deployment's default applies)."""


def get_organisation(session: Session, org_id: str) -> Organisation:
    """The organisation of an authenticated principal (or of a key just issued), which always exists."""
    org = session.get(Organisation, org_id)
    assert org is not None
    return org


def lock_organisation(session: Session, org_id: str) -> Organisation:
    """Serialise, until commit, everything one organisation counts against a limit (job admissions, webhook
    endpoints): an UPDATE of its row takes the row lock on PostgreSQL and the write lock on SQLite, so a count
    taken after it stays true until this transaction's insert commits."""
    session.execute(
        update(Organisation).where(Organisation.id == org_id).values(updated_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    return get_organisation(session, org_id)


def get_or_create_org(session: Session, name: str) -> Organisation:
    org = session.scalar(select(Organisation).where(Organisation.name == name))
    if org is not None:
        return org
    org = Organisation(name=name)
    session.add(org)
    try:
        session.flush()
    except IntegrityError:  # created concurrently by another process: use theirs
        session.rollback()
        org = session.scalar(select(Organisation).where(Organisation.name == name))
        assert org is not None
    return org


def create_api_key(
    session: Session, settings: Settings, *, org_name: str, scopes: list[str] | tuple[str, ...], name: str = "default",
    plaintext: str | None = None,
) -> IssuedKey:
    """Create a key for `org_name` (creating the organisation if needed). The caller commits."""
    normalized = normalize_scopes(scopes)
    org = get_or_create_org(session, org_name)
    plaintext = plaintext or KEY_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey(
        org_id=org.id, name=name, prefix=plaintext[:12], key_hash=hash_key(plaintext, settings),
        scopes=",".join(normalized),
    )
    session.add(key)
    session.flush()
    return IssuedKey(key.id, org.id, plaintext, normalized)


def issue_api_key(session: Session, settings: Settings, *, org_name: str, scopes: list[str] | tuple[str, ...],
                  name: str, limits: Mapping[str, int | None]) -> IssuedKey:
    """`draftsmith keys create`: a key for `org_name` (created if needed) and the organisation's own limits (the
    `ORGANISATION_LIMITS` given and not None; the others keep their value), committed together."""
    unknown = set(limits) - set(ORGANISATION_LIMITS)
    if unknown:
        raise ValueError(f"unknown organisation limits {sorted(unknown)}; known: {', '.join(ORGANISATION_LIMITS)}")
    issued = create_api_key(session, settings, org_name=org_name, scopes=scopes, name=name)
    org = get_organisation(session, issued.org_id)
    for limit, value in limits.items():
        if value is not None:
            setattr(org, limit, value)
    session.commit()
    return issued


def revoke_api_key(session: Session, key_id: str) -> bool:
    """`draftsmith keys revoke`: the key refuses requests from now on (revoking twice keeps the first time).
    False when there is no such key."""
    key = session.get(ApiKey, key_id)
    if key is None:
        return False
    key.revoked_at = key.revoked_at or utcnow()
    session.commit()
    return True


def api_key_by_id(session: Session, key_id: object) -> ApiKey | None:
    """The key row of `key_id` (revoked or not), or None: a signed download link names its key by id, and a
    link that names none (or not a string) finds no key."""
    return session.get(ApiKey, key_id) if isinstance(key_id, str) else None


def ensure_dev_key(session: Session, settings: Settings, plaintext: str) -> ApiKey:
    """Development mode: the configured local key belongs to org `local` with every scope."""
    key = session.scalar(select(ApiKey).where(ApiKey.key_hash == hash_key(plaintext, settings)))
    if key is None:
        create_api_key(session, settings, org_name=settings.dev_org_name, scopes=SCOPES, name="development",
                       plaintext=plaintext)
        session.commit()
        key = session.scalar(select(ApiKey).where(ApiKey.key_hash == hash_key(plaintext, settings)))
        assert key is not None
    return key


# Built once (the hash is a bound parameter): building the SELECT per request cost ~50 us of CPU.
_KEY_LOOKUP = (
    select(ApiKey.id, ApiKey.org_id, ApiKey.scopes, ApiKey.revoked_at, ApiKey.last_used_at,
           Organisation.name.label("org_name"))
    .join(Organisation, Organisation.id == ApiKey.org_id)
    .where(ApiKey.key_hash == bindparam("key_hash"))
)


def live_key(session: Session, settings: Settings, plaintext: str) -> Row[*tuple[Any, ...]] | None:
    """The key `plaintext` with its organisation's name (id, org_id, scopes, org_name), or None when it is unknown
    or revoked. Records that the key is still used, at most once per `LAST_USED_RESOLUTION` (committed)."""
    # One round trip for the key and its organisation: this runs on every request, so it reads the columns it
    # needs as a plain row (an ORM ApiKey entity costs as much again in CPU).
    # On the session's connection: a Core statement needs none of the ORM's per-statement work.
    key = session.connection().execute(_KEY_LOOKUP, {"key_hash": hash_key(plaintext, settings)}).first()
    if key is None or key.revoked_at is not None:
        return None
    now = utcnow()
    if key.last_used_at is None or now - key.last_used_at > LAST_USED_RESOLUTION:
        session.execute(update(ApiKey).where(ApiKey.id == key.id).values(last_used_at=now))
        session.commit()
    return key
