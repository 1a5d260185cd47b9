"""API keys, organisations and scopes.

A key is `dsk_` + 43 random URL-safe characters (256 bits), shown once at creation. The database
keeps only HMAC-SHA256(secret_key, key): a leaked table cannot be turned back into keys, nor
checked against guesses without the deployment's secret. Scopes nest: admin ⊃ write ⊃ read.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import bindparam, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from domain.models import ApiKey, Organisation, utcnow
from api.problems import Forbidden, Unauthenticated
from domain.settings import Settings

KEY_PREFIX = "dsk_"
SCOPES = ("read", "write", "admin")
_SCOPE_RANK = {scope: rank for rank, scope in enumerate(SCOPES)}
LAST_USED_RESOLUTION = timedelta(minutes=1)  # don't write on every request just to say "still used"


@dataclass(frozen=True)
class Principal:
    """Who is calling: the organisation every query is scoped to, and what the key may do."""

    org_id: str
    org_name: str
    key_id: str
    scopes: frozenset[str]

    def has_scope(self, needed: str) -> bool:
        return any(_SCOPE_RANK[held] >= _SCOPE_RANK[needed] for held in self.scopes)

    def require(self, needed: str) -> None:
        if not self.has_scope(needed):
            raise Forbidden(
                f"this API key has scopes [{', '.join(sorted(self.scopes))}]; this operation needs '{needed}'. "
                "Create a key with that scope: draftsmith keys create --org NAME --scope " + needed
            )


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
    return tuple(sorted(set(scopes), key=_SCOPE_RANK.__getitem__))


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


def _ensure_dev_key(session: Session, settings: Settings, plaintext: str) -> ApiKey:
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


def authenticate(session: Session, settings: Settings, authorization: str | None) -> Principal:
    """Resolve an `Authorization: Bearer dsk_...` header to a Principal, or raise 401."""
    if not authorization:
        raise Unauthenticated("send your API key as `Authorization: Bearer dsk_...`")
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Unauthenticated("the Authorization header must be `Bearer <api key>`")
    if not token.startswith(KEY_PREFIX) or len(token) > 200 or not token.isascii() or not token.isprintable():
        # Keys are printable ASCII; anything else (a header decoded as Latin-1, a control character) is not
        # ours, and hmac.compare_digest refuses non-ASCII text.
        raise Unauthenticated("that is not a Draftsmith API key (keys start with dsk_)")
    if settings.development and hmac.compare_digest(token, settings.dev_api_key.get_secret_value()):
        _ensure_dev_key(session, settings, token)
    # One round trip for the key and its organisation: this runs on every request, so it reads the columns it
    # needs as a plain row (an ORM ApiKey entity costs as much again in CPU).
    # On the session's connection: a Core statement needs none of the ORM's per-statement work.
    key = session.connection().execute(_KEY_LOOKUP, {"key_hash": hash_key(token, settings)}).first()
    if key is None or key.revoked_at is not None:
        raise Unauthenticated("unknown or revoked API key")
    now = utcnow()
    if key.last_used_at is None or now - key.last_used_at > LAST_USED_RESOLUTION:
        session.execute(update(ApiKey).where(ApiKey.id == key.id).values(last_used_at=now))
        session.commit()
    return Principal(org_id=key.org_id, org_name=key.org_name, key_id=key.id, scopes=frozenset(key.scopes.split(",")))
