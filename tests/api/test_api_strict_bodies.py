"""Every JSON body the API takes has strict JSON types (schemas/bounds.py `JsonBody`): an integer field refuses
`true`, `"12"` and `12.0`, a number field `true` and `"0.7"` (an integer stays a fine number), a boolean `1` and
`"true"`, a string a number; each refusal is a 422 naming the field. The routes that parse their body themselves
(the job spec, the estimate, the audit) and those FastAPI parses (webhooks, secrets, audit thresholds) alike."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
from api_harness import Harness, Org, build_harness, make_settings

from api.main import create_app

JOB = {"target": {"uri": "bundled:smollm2-135m"}}
AUDIT = {"drafter": "drf_" + "0" * 26, "target": {"uri": "bundled:smollm2-135m"}}
WEBHOOK = {"url": "http://127.0.0.1:9/hook"}

INTEGER_FIELDS = [  # (method, path, body, field, a valid integer)
    ("POST", "/v1/jobs", JOB, "training.max_steps", 12),
    ("POST", "/v1/jobs", JOB, "sampling.top_k", 12),
    ("POST", "/v1/jobs", JOB, "training.zero_stage", 2),  # a Literal[2, 3]: 2.0 equals 2, and is still refused
    ("POST", "/v1/jobs/estimate", JOB, "training.max_steps", 12),
    ("POST", "/v1/jobs/estimate", JOB, "drafter.block_size", 12),
    ("POST", "/v1/jobs/estimate", JOB, "data.count", 12),
    ("POST", "/v1/jobs/estimate", JOB, "training.zero_stage", 3),
    ("POST", "/v1/audits", AUDIT, "validation.prompts", 12),
    ("POST", "/v1/audits", AUDIT, "sampling.seed", 12),
]
NUMBER_FIELDS = [  # (method, path, body, field, a valid number); `1` must stay accepted
    ("POST", "/v1/jobs", JOB, "sampling.temperature", 0.7),
    ("POST", "/v1/jobs/estimate", JOB, "sampling.temperature", 0.7),
    ("POST", "/v1/jobs/estimate", JOB, "training.learning_rate", 0.5),
    ("POST", "/v1/audits", AUDIT, "reference_tau", 1.5),
    ("PUT", "/v1/audit-thresholds", {}, "keep_min_gain_ratio", 0.7),
]
BOOLEAN_FIELDS = [  # (method, path, body, field)
    ("POST", "/v1/jobs/estimate", JOB, "target.allow_pickle"),
    ("POST", "/v1/webhooks", WEBHOOK, "enabled"),
    ("PATCH", "/v1/webhooks/{webhook_id}", {}, "enabled"),
]
STRING_FIELDS = [  # (method, path, body, field)
    ("PUT", "/v1/secrets/{name}", {}, "value"),
    ("POST", "/v1/audits", AUDIT, "drafter"),
]


@pytest.fixture(scope="module")
def strict_harness(sqlite_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    yield from build_harness(make_settings(sqlite_url, tmp_path_factory.mktemp("strict") / "storage"))


@pytest.fixture(scope="module")
def org(strict_harness: Harness) -> Org:
    return strict_harness.new_org()


@pytest.fixture(scope="module")
def hook(strict_harness: Harness, org: Org) -> str:
    created = strict_harness.client.post("/v1/webhooks", headers=org.headers, json=WEBHOOK)
    assert created.status_code == 201, created.text
    return created.json()["id"]


def with_field(body: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    changed = copy.deepcopy(body)
    *sections, name = dotted.split(".")
    node = changed
    for section in sections:
        node = node.setdefault(section, {})
    node[name] = value
    return changed


def send(harness: Harness, org: Org, hook: str, method: str, path: str, body: dict[str, Any]) -> Any:
    """`path` as the OpenAPI document writes it, its parameters filled in."""
    return harness.client.request(method, path.format(webhook_id=hook, name="hub-token"), headers=org.headers,
                                  json=body)


def assert_refused(response: Any, field: str, value: Any) -> None:
    assert response.status_code == 422, (value, response.status_code, response.text)
    problem = response.json()
    assert field in [error["field"] for error in problem["errors"]], (value, problem)


def assert_accepted(response: Any, value: Any) -> None:
    # Accepted by validation: the audit then answers 404 for its made-up drafter, everything else 2xx.
    assert response.status_code in (200, 201, 404), (value, response.status_code, response.text)
    assert response.status_code != 404 or response.json()["type"].endswith(":not-found"), response.text


@pytest.mark.parametrize(("method", "path", "body", "field", "valid"), INTEGER_FIELDS,
                         ids=[f"{m} {p} {f}" for m, p, _, f, _ in INTEGER_FIELDS])
def test_integer_fields_take_json_integers_only(strict_harness, org, hook, method, path, body, field, valid):
    for wrong in (True, str(valid), float(valid)):
        assert_refused(send(strict_harness, org, hook, method, path, with_field(body, field, wrong)), field, wrong)
    assert_accepted(send(strict_harness, org, hook, method, path, with_field(body, field, valid)), valid)


@pytest.mark.parametrize(("method", "path", "body", "field", "valid"), NUMBER_FIELDS,
                         ids=[f"{m} {p} {f}" for m, p, _, f, _ in NUMBER_FIELDS])
def test_number_fields_take_json_numbers_integers_included(strict_harness, org, hook, method, path, body, field,
                                                           valid):
    for wrong in (True, str(valid)):
        assert_refused(send(strict_harness, org, hook, method, path, with_field(body, field, wrong)), field, wrong)
    for right in (valid, 1):  # JSON has one number type: 1 is as good a temperature as 1.0
        assert_accepted(send(strict_harness, org, hook, method, path, with_field(body, field, right)), right)


@pytest.mark.parametrize(("method", "path", "body", "field"), BOOLEAN_FIELDS,
                         ids=[f"{m} {p} {f}" for m, p, _, f in BOOLEAN_FIELDS])
def test_boolean_fields_take_json_booleans_only(strict_harness, org, hook, method, path, body, field):
    for wrong in (1, 0, "true", "false"):
        assert_refused(send(strict_harness, org, hook, method, path, with_field(body, field, wrong)), field, wrong)
    assert_accepted(send(strict_harness, org, hook, method, path, with_field(body, field, False)), False)


@pytest.mark.parametrize(("method", "path", "body", "field"), STRING_FIELDS,
                         ids=[f"{m} {p} {f}" for m, p, _, f in STRING_FIELDS])
def test_string_fields_take_json_strings_only(strict_harness, org, hook, method, path, body, field):
    for wrong in (12, 12.0, True):
        assert_refused(send(strict_harness, org, hook, method, path, with_field(body, field, wrong)), field, wrong)


def test_every_json_body_route_has_its_strictness_checked():
    """A new route taking a JSON body must join the tables above."""
    document = create_app().openapi()
    json_bodies = {(method.upper(), path) for path, item in document["paths"].items()
                   for method, operation in item.items()
                   if "application/json" in operation.get("requestBody", {}).get("content", {})}
    checked = {(method, path) for method, path, *_ in INTEGER_FIELDS + NUMBER_FIELDS + BOOLEAN_FIELDS + STRING_FIELDS}
    assert json_bodies - checked == set(), "add a strictness case for these routes"
    assert len(json_bodies) >= 7, json_bodies  # jobs, estimate, audits, thresholds, webhooks (2), secrets


def test_python_callers_still_build_specs_from_values_of_the_fields_types():
    """Strict mode holds for Python callers too: values of the fields' own types pass (the CLI's typed flags,
    a stored spec read back from its JSON), an int for a float included."""
    from schemas.job_spec import JobSpec
    from schemas.sampling import SamplingParams

    spec = JobSpec.model_validate({**JOB, "sampling": {"temperature": 1, "top_k": 5},
                                   "drafter": {"target_layer_ids": [1, 2]}, "training": {"zero_stage": 3}})
    assert spec.sampling.temperature == 1.0 and spec.training.zero_stage == 3
    assert JobSpec.model_validate(spec.model_dump(mode="json")) == spec
    assert SamplingParams(temperature=1, max_new_tokens=8).temperature == 1.0
