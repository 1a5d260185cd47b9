"""Who is calling: the `Authorization: Bearer dsk_...` header checked against the key store (domain/keys.py) and
turned into a Principal, the organisation every query is scoped to and what the key may do. Scopes nest:
admin ⊃ write ⊃ read.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from api.problems import Forbidden, Unauthenticated
from domain.db import Session
from domain.keys import KEY_PREFIX, SCOPE_RANK, ensure_dev_key, live_key
from domain.keys import create_api_key as create_api_key  # noqa: F401 - where the dashboard tests still import it
from domain.settings import Settings


@dataclass(frozen=True)
class Principal:
    """Who is calling: the organisation every query is scoped to, and what the key may do."""

    org_id: str
    org_name: str
    key_id: str
    scopes: frozenset[str]

    def has_scope(self, needed: str) -> bool:
        return any(SCOPE_RANK[held] >= SCOPE_RANK[needed] for held in self.scopes)

    def require(self, needed: str) -> None:
        if not self.has_scope(needed):
            raise Forbidden(
                f"this API key has scopes [{', '.join(sorted(self.scopes))}]; this operation needs '{needed}'. "
                "Create a key with that scope: draftsmith keys create --org NAME --scope " + needed
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
        ensure_dev_key(session, settings, token)
    key = live_key(session, settings, token)
    if key is None:
        raise Unauthenticated("unknown or revoked API key")
    return Principal(org_id=key.org_id, org_name=key.org_name, key_id=key.id, scopes=frozenset(key.scopes.split(",")))
