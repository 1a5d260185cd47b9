"""Every domain refusal (domain/errors.py) and every HTTP-only one (api/problems.py) answers with its own
status, problem type and headers: a client branches on these, so a new error class must be placed here."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from api import problems
from api.problems import PROBLEM_MEDIA_TYPE, PROBLEM_TYPE_BASE, install_problem_handlers
from domain import errors

EXPECTED_STATUS = {
    errors.DomainError: 400,
    errors.InvalidRequest: 422,
    errors.NotFound: 404,
    errors.Conflict: 409,
    errors.InvalidTransition: 409,
    errors.IdempotencyConflict: 409,
    errors.StageConflict: 409,
    errors.CancellationPending: 409,
    errors.StageBusy: 409,
    errors.TooManyActiveJobs: 429,
    errors.QuotaExceeded: 429,
    errors.ServiceUnavailable: 503,
    problems.Unauthenticated: 401,
    problems.Forbidden: 403,
    problems.PayloadTooLarge: 413,
}


def every_error_class() -> set[type]:
    found, todo = set(), [errors.DomainError]
    while todo:
        kind = todo.pop()
        found.add(kind)
        todo.extend(kind.__subclasses__())
    return {kind for kind in found if kind.__module__ in ("domain.errors", "api.problems")}


def test_every_error_class_has_a_status_here():
    assert every_error_class() == set(EXPECTED_STATUS)


def test_the_domain_errors_carry_no_http():
    for kind in every_error_class():
        if kind.__module__ == "domain.errors":
            assert not hasattr(kind, "status") and not hasattr(kind, "headers"), kind


@pytest.fixture(scope="module")
def client() -> TestClient:
    app = FastAPI()
    install_problem_handlers(app)

    @app.get("/raise/{name}")
    def raise_it(name: str) -> None:
        kind = {kind.__name__: kind for kind in EXPECTED_STATUS}[name]
        raise kind(f"{name} happened", errors=[errors.FieldError(field="x.y", message="fix it")],
                   retry_after_seconds=7 if kind is errors.ServiceUnavailable else None, extra={"job_id": "j1"})

    return TestClient(app)


@pytest.mark.parametrize("kind", sorted(EXPECTED_STATUS, key=lambda kind: kind.__name__), ids=lambda k: k.__name__)
def test_each_error_answers_as_a_problem(client, kind):
    response = client.get(f"/raise/{kind.__name__}")
    assert response.status_code == EXPECTED_STATUS[kind]
    assert response.headers["content-type"] == PROBLEM_MEDIA_TYPE
    body = response.json()
    assert body["type"] == PROBLEM_TYPE_BASE + kind.slug and body["title"] == kind.title
    assert body["detail"] == f"{kind.__name__} happened" and body["instance"] == f"/raise/{kind.__name__}"
    assert body["errors"] == [{"field": "x.y", "message": "fix it"}] and body["job_id"] == "j1"
    assert ("Retry-After" in response.headers) == (kind is errors.ServiceUnavailable)
    if kind is errors.ServiceUnavailable:
        assert response.headers["Retry-After"] == "7"
    assert ("WWW-Authenticate" in response.headers) == (kind is problems.Unauthenticated)
