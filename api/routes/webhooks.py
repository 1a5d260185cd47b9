"""/v1/webhooks: per-organisation endpoints (admin scope) and their delivery log."""

from __future__ import annotations

from fastapi import APIRouter, Response

from api.deps import AdminPrincipal, SessionDep, SettingsDep
from api.problems import problem_responses
from api.schemas import (
    WebhookAttemptOut,
    WebhookCreate,
    WebhookCreated,
    WebhookDeliveryList,
    WebhookDeliveryOut,
    WebhookList,
    WebhookOut,
    WebhookUpdate,
)
from domain.egress import EgressPolicy, EgressRefused
from domain.errors import FieldError, InvalidRequest, NotFound
from domain.models import Webhook
from domain.settings import Settings
from domain.webhooks import add_webhook, change_webhook, recent_deliveries, remove_webhook, webhook_for_org, webhooks_of

router = APIRouter(prefix="/v1/webhooks", tags=["webhooks"])
MAX_WEBHOOK_URL_LENGTH = 2048  # the column's size


def _out(hook: Webhook) -> WebhookOut:
    return WebhookOut(id=hook.id, url=hook.url, events=list(hook.event_types), description=hook.description,
                      enabled=hook.enabled, created_at=hook.created_at, updated_at=hook.updated_at)


def _checked_url(url: str, settings: Settings) -> str:
    problem = None
    if len(url) > MAX_WEBHOOK_URL_LENGTH:
        problem = f"must be at most {MAX_WEBHOOK_URL_LENGTH} characters"
    else:
        try:  # by the addresses the host resolves to (domain/egress.py); judged again at every delivery
            EgressPolicy.from_settings(settings).check_url(url)
        except EgressRefused as exc:
            problem = str(exc)
    if problem:
        raise InvalidRequest(f"url: {problem}", errors=[FieldError(field="url", message=problem)])
    return url


def _get(session: SessionDep, org_id: str, webhook_id: str) -> Webhook:
    hook = webhook_for_org(session, org_id, webhook_id)
    if hook is None:
        raise NotFound(f"no webhook {webhook_id!r} in your organisation")
    return hook


@router.post("", status_code=201, response_model=WebhookCreated, summary="Register a webhook endpoint",
             description="The response carries the `whsec_...` signing secret, shown this once.",
             responses=problem_responses(401, 403, 409, 422))
def create_webhook(principal: AdminPrincipal, session: SessionDep, settings: SettingsDep,
                   body: WebhookCreate) -> WebhookCreated:
    url = _checked_url(str(body.url), settings)
    # Counted and inserted under the organisation's lock, at most MAX_WEBHOOKS_PER_ORG (domain/webhooks.py).
    hook = add_webhook(session, principal.org_id, url=url, events=body.events, description=body.description,
                       enabled=body.enabled)
    return WebhookCreated(**_out(hook).model_dump(), secret=hook.secret)


@router.get("", response_model=WebhookList, summary="List webhook endpoints", responses=problem_responses(401, 403))
def list_webhooks(principal: AdminPrincipal, session: SessionDep) -> WebhookList:
    return WebhookList(data=[_out(h) for h in webhooks_of(session, principal.org_id)])


@router.get("/{webhook_id}", response_model=WebhookOut, summary="Get a webhook endpoint",
            responses=problem_responses(401, 403, 404))
def get_webhook(principal: AdminPrincipal, session: SessionDep, webhook_id: str) -> WebhookOut:
    return _out(_get(session, principal.org_id, webhook_id))


@router.patch("/{webhook_id}", response_model=WebhookOut, summary="Change a webhook endpoint",
              responses=problem_responses(401, 403, 404, 422))
def update_webhook(principal: AdminPrincipal, session: SessionDep, settings: SettingsDep, webhook_id: str,
                   body: WebhookUpdate) -> WebhookOut:
    hook = _get(session, principal.org_id, webhook_id)
    changes: dict[str, object] = {}
    if body.url is not None:
        changes["url"] = _checked_url(str(body.url), settings)
    if body.events is not None:
        changes["event_types"] = body.events
    if "description" in body.model_fields_set:
        changes["description"] = body.description
    if body.enabled is not None:
        changes["enabled"] = body.enabled
    return _out(change_webhook(session, hook, **changes))


@router.delete("/{webhook_id}", status_code=204, response_class=Response, summary="Delete a webhook endpoint",
               responses=problem_responses(401, 403, 404))
def delete_webhook(principal: AdminPrincipal, session: SessionDep, webhook_id: str) -> Response:
    remove_webhook(session, _get(session, principal.org_id, webhook_id))
    return Response(status_code=204)


@router.get("/{webhook_id}/deliveries", response_model=WebhookDeliveryList,
            summary="Recent deliveries to this endpoint, newest first, with every attempt",
            responses=problem_responses(401, 403, 404))
def list_deliveries(principal: AdminPrincipal, session: SessionDep, webhook_id: str) -> WebhookDeliveryList:
    hook = _get(session, principal.org_id, webhook_id)
    return WebhookDeliveryList(data=[
        WebhookDeliveryOut(
            id=d.id, event_type=d.event_type, job_id=d.job_id, status=d.status,  # type: ignore[arg-type]
            attempt_count=d.attempt_count, next_attempt_at=d.next_attempt_at, created_at=d.created_at,
            attempts=[WebhookAttemptOut.model_validate(a, from_attributes=True) for a in attempts],
        )
        for d, attempts in recent_deliveries(session, hook.id)
    ])
