"""Download links for the dashboard's Download buttons.

A browser download is a navigation, and a navigation cannot carry the `Authorization` header the
API needs; fetching the bytes with the key instead would hold a multi-gigabyte GGUF in the page's
memory. So the page asks, with its key, for a link to one artifact (POST /dashboard/download-links)
and then navigates to it. The link is an HMAC-signed token naming the key, the job and the artifact,
valid for LINK_TTL_SECONDS; following it re-checks that the key is still live and then answers like
GET /v1/jobs/{id}/artifacts/{name}: streamed bytes (local storage) or 307 to a presigned URL (S3).
The API key itself never appears in a URL.

The page also reads two small artifacts itself (report.json and the model card). GET /v1 answers
those with a redirect to object storage when storage is S3, which a script may only follow if the
bucket allows CORS from the dashboard's origin; so the page reads them through
GET /dashboard/jobs/{id}/artifacts/{name} instead, which the API serves from storage itself, up to
INLINE_MAX_BYTES, as inert text.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import time

from fastapi import APIRouter
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from api.deps import ReadPrincipal, ServicesDep, SessionDep
from api.problems import PayloadTooLarge
from api.routes.job_data import artifact_response
from domain.artifacts import artifact_named
from domain.errors import NotFound
from domain.jobs import get_job_for_org
from domain.keys import api_key_by_id
from domain.settings import Settings

router = APIRouter(prefix="/dashboard", include_in_schema=False)
LINK_TTL_SECONDS = 120
INLINE_MAX_BYTES = 8 << 20  # a report or model card is a few KB; anything larger is a download
_TOKEN_RE = re.compile(r"[A-Za-z0-9_-]{1,2048}\.[A-Za-z0-9_-]{43}")  # claims . HMAC-SHA256, base64url unpadded
_PURPOSE = b"draftsmith-dashboard-download-v1"  # a key of its own, derived from the deployment secret


class DownloadLinkIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    job_id: str = Field(max_length=64)
    name: str = Field(min_length=1, max_length=255)


class DownloadLinkOut(BaseModel):
    url: str
    expires_in: int


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _signing_key(settings: Settings) -> bytes:
    return hmac.new(settings.secret_key.get_secret_value().encode(), _PURPOSE, hashlib.sha256).digest()


def sign_download(settings: Settings, *, key_id: str, job_id: str, name: str, now: float | None = None) -> str:
    claims = {"k": key_id, "j": job_id, "n": name, "e": int((now or time.time()) + LINK_TTL_SECONDS)}
    payload = _b64(json.dumps(claims, separators=(",", ":")).encode())
    signature = _b64(hmac.new(_signing_key(settings), payload.encode(), hashlib.sha256).digest())
    return f"{payload}.{signature}"


def verify_download(settings: Settings, token: str, *, now: float | None = None) -> dict:
    """The token's claims, or NotFound: a forged, altered or expired link looks like no link."""
    invalid = NotFound("this download link is invalid or has expired; press Download again")
    if not _TOKEN_RE.fullmatch(token):  # ours are base64url.base64url; anything else (`é.é`) is no link either
        raise invalid
    payload, _, signature = token.partition(".")
    expected = _b64(hmac.new(_signing_key(settings), payload.encode(), hashlib.sha256).digest())
    if not signature or not hmac.compare_digest(signature, expected):
        raise invalid
    try:
        claims = json.loads(_unb64(payload))
    except ValueError:
        raise invalid from None
    if not isinstance(claims, dict) or not isinstance(claims.get("e"), int) or claims["e"] < (now or time.time()) \
            or not all(isinstance(claims.get(name), str) for name in ("k", "j", "n")):
        raise invalid
    return claims


@router.post("/download-links", response_model=DownloadLinkOut)
def create_download_link(principal: ReadPrincipal, session: SessionDep, services: ServicesDep,
                         body: DownloadLinkIn) -> DownloadLinkOut:
    job = get_job_for_org(session, principal.org_id, body.job_id)
    if artifact_named(session, job.id, body.name) is None:
        raise NotFound(f"job {job.id} has no artifact {body.name!r}")
    token = sign_download(services.settings, key_id=principal.key_id, job_id=job.id, name=body.name)
    return DownloadLinkOut(url=f"/dashboard/downloads/{token}", expires_in=LINK_TTL_SECONDS)


@router.get("/downloads/{token}")
def follow_download_link(token: str, session: SessionDep, services: ServicesDep) -> Response:
    claims = verify_download(services.settings, token)
    key = api_key_by_id(session, claims.get("k"))
    if key is None or key.revoked_at is not None:  # revoking a key also kills its pending links
        raise NotFound("this download link is invalid or has expired; press Download again")
    job = get_job_for_org(session, key.org_id, str(claims.get("j")))
    artifact = artifact_named(session, job.id, str(claims.get("n")))
    if artifact is None:
        raise NotFound(f"job {job.id} has no artifact {claims.get('n')!r}")
    # no-store: the link itself is the credential; a shared cache must not keep the bytes behind it.
    return artifact_response(services, artifact, cache_control="no-store")


@router.get("/jobs/{job_id}/artifacts/{name:path}")
def read_small_artifact(principal: ReadPrincipal, session: SessionDep, services: ServicesDep, job_id: str,
                        name: str) -> Response:
    job = get_job_for_org(session, principal.org_id, job_id)
    artifact = artifact_named(session, job.id, name)
    if artifact is None:
        raise NotFound(f"job {job.id} has no artifact {name!r}")
    if artifact.size_bytes > INLINE_MAX_BYTES:
        raise PayloadTooLarge(f"{name} is {artifact.size_bytes} bytes; the dashboard reads artifacts up to "
                              f"{INLINE_MAX_BYTES} bytes; download it instead")
    if not services.storage.exists(artifact.storage_key):
        raise NotFound(f"artifact {name!r} is registered but its bytes are missing from storage")
    data = b"".join(services.storage.open_chunks(artifact.storage_key))
    # JSON stays JSON; anything else (markdown, even HTML) is plain text, inert in a sandbox.
    media_type = "application/json" if artifact.content_type == "application/json" else "text/plain; charset=utf-8"
    return Response(data, media_type=media_type, headers={
        "X-Content-Type-Options": "nosniff", "Content-Security-Policy": "sandbox", "Cache-Control": "no-store",
        "ETag": f'"{artifact.sha256}"'})
