"""Property-based fuzzing of every operation in our own OpenAPI document (schemathesis, ASGI transport):
whatever it generates, valid or deliberately invalid, the API never answers 5xx. Every operation is fuzzed, every
request body generated (an unresolvable `$ref` once left the audit body out silently), and the bodies routes parse
themselves (job spec, estimate, audit) are also generated with their references made valid, so that they reach the
handlers behind their validation.

Bounded: a fixed number of examples per operation and mode, no shrinking phase, derandomised, so
the run is reproducible and takes well under a minute on a quiet 2-core machine (printed, not asserted:
speed targets live in bench/). (schemathesis' own
pytest plugin does not support pytest 9 yet, so each operation's strategy is driven directly.)
"""

from __future__ import annotations

import copy
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from api_harness import Harness, build_harness, make_settings
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core import NotSet

from api.main import create_app, schema_refs

EXAMPLES_PER_OPERATION_AND_MODE = 25
SPEC_BODIES = {"POST /v1/jobs", "POST /v1/jobs/estimate", "POST /v1/audits"}
"""The bodies whose generated examples almost never pass validation as they are: random text is no hf://, s3:// or
bundled: URI, no device, no label key. `with_valid_references` mends those fields and leaves the numbers, flags and
sections as generated, so the handlers behind validation see many different specs."""


def with_valid_references(case: Any) -> Any:
    body = case.body
    if not isinstance(body, dict):
        return case
    body = copy.deepcopy(body)
    for dropped in ("publish", "labels", "name"):  # free text and references of their own
        body.pop(dropped, None)
    if isinstance(body.get("target"), dict):
        body["target"]["uri"] = "bundled:smollm2-135m"
    if isinstance(body.get("drafter"), str):
        body["drafter"] = "hf://acme/drafter"
    if isinstance(body.get("init"), dict):
        body["init"]["from_drafter"] = "hf://acme/drafter"
    if isinstance(body.get("data"), dict):
        body["data"]["source"] = "builtin"
    if isinstance(body.get("compute"), dict):
        body["compute"]["device"] = "auto"
    sampling = body.get("sampling")
    if isinstance(sampling, dict) and isinstance(sampling.get("chat_template"), dict):
        sampling["chat_template"].pop("system_prompt", None)
    case.body = body
    return case


@pytest.fixture
def fuzz_harness(sqlite_url: str, tmp_path: Path) -> Iterator[Harness]:
    # Short SSE streams: a generated `Accept: text/event-stream` must not hold the run up.
    yield from build_harness(make_settings(sqlite_url, tmp_path / "storage", sse_max_stream_seconds=0.3))


def test_no_server_errors(fuzz_harness: Harness):
    org = fuzz_harness.new_org(limit=10_000)  # the jobs and audits created stay under the active-work limit
    finished = fuzz_harness.create_job(org)["id"]
    fuzz_harness.runner.run_to_end(finished)  # so artifacts, metrics and events exist to be fetched
    fuzz_harness.runner.run_stage(fuzz_harness.create_job(org)["id"], finish=False)
    app = create_app(fuzz_harness.settings)
    app.state.services = fuzz_harness.services
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)

    started = time.monotonic()
    exercised: list[str] = []
    statuses: Counter[int] = Counter()
    bodies_sent: set[str] = set()
    admitted: Counter[int] = Counter()
    operations = [result.ok() for result in schema.get_all_operations()]
    for operation in operations:
        runs = [(mode.value, operation.as_strategy(generation_mode=mode))
                for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)]
        if operation.label in SPEC_BODIES:
            runs.append(("valid references", operation.as_strategy().map(with_valid_references)))
        for run, strategy in runs:

            @given(case=strategy)
            @settings(max_examples=EXAMPLES_PER_OPERATION_AND_MODE, deadline=None, derandomize=True,
                      phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck),
                      database=None)
            def call_operation(case) -> None:  # noqa: ANN001
                response = case.call(headers=org.headers)
                statuses[response.status_code] += 1
                if not isinstance(case.body, NotSet):
                    bodies_sent.add(operation.label)
                if run == "valid references":
                    admitted[response.status_code] += 1
                case.validate_response(response, checks=[not_a_server_error])

            try:
                call_operation()
            except Unsatisfiable:
                # An operation without parameters or body (GET /healthz) has no invalid variant to make.
                assert run == GenerationMode.NEGATIVE.value, operation.label
                continue
            exercised.append(f"{operation.label} [{run}]")
    elapsed = time.monotonic() - started
    assert {label.split(" [")[0] for label in exercised} == {operation.label for operation in operations}
    assert len(operations) >= 20, [operation.label for operation in operations]  # every route was fuzzed
    with_body = {operation.label for operation in operations if operation.body}
    assert {"POST /v1/audits", "POST /v1/jobs", "PUT /v1/audit-thresholds"} <= with_body
    assert bodies_sent == with_body, with_body - bodies_sent  # every body was generated, not left unset
    assert sum(label.endswith("[negative]") for label in exercised) >= 12  # and invalid input was sent
    successes = sum(n for status, n in statuses.items() if status < 300)
    assert successes > 0.05 * statuses.total(), statuses  # authenticated, and reaching the handlers
    assert sum(n for status, n in admitted.items() if status < 300) > 15, admitted  # specs reached the handlers
    print(f"fuzzed {len(exercised)} operation modes in {elapsed:.1f}s: {dict(statuses)}; specs with valid "
          f"references: {dict(admitted)}")


def _resolve_pointer(document: dict[str, Any], ref: str) -> Any:
    """The node a local `$ref` (`#/a/b~1c`) points to in `document`; KeyError when there is none."""
    node: Any = document
    for token in ref.removeprefix("#/").split("/"):
        token = token.replace("~1", "/").replace("~0", "~")
        node = node[int(token)] if isinstance(node, list) else node[token]
    return node


def test_every_ref_in_the_openapi_document_resolves(fuzz_harness: Harness):
    """The served /openapi.json is self-contained: every `$ref` points at a node of the document itself. Client
    generators fail on a dangling one, and schemathesis silently generates no body behind it (the audit spec's was
    missing from the components, as a body that its route parses by hand)."""
    response = fuzz_harness.client.get("/openapi.json")
    assert response.status_code == 200
    document = response.json()
    refs = set(schema_refs(document))
    assert "#/components/schemas/AuditSpec" in refs and "#/components/schemas/JobSpec" in refs
    unresolved = []
    for ref in sorted(refs):
        try:
            assert ref.startswith("#/"), "only references inside the document"
            _resolve_pointer(document, ref)
        except (AssertionError, KeyError, IndexError, ValueError, TypeError):
            unresolved.append(ref)
    assert not unresolved, unresolved
    audit = document["components"]["schemas"]["AuditSpec"]
    assert {"drafter", "target"} <= set(audit["properties"]) and audit["required"] == ["drafter", "target"]


def test_openapi_documents_every_error_as_problem_json():
    from api.main import create_app as build

    document = build().openapi()
    errors_seen = 0
    for path, path_item in document["paths"].items():
        for method, operation in path_item.items():
            assert operation.get("summary"), (method, path)
            for status, response in operation["responses"].items():
                if int(status) >= 400:
                    errors_seen += 1
                    assert list(response["content"]) == ["application/problem+json"], (method, path, status)
    assert errors_seen > 40
    assert document["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/JobSpec"}
    assert "JobSpec" in document["components"]["schemas"]


def test_requests_valid_by_the_document_pass_every_parameter_rule(fuzz_harness: Harness):
    """The API's own rules on path and query parameters are stated in the document (api/edge.py
    state_parameter_rules, and each route's pattern): no control characters anywhere, ids and cursors of their
    form, secret names, months, label filters. So a request that the document calls valid (schemathesis' positive
    mode) is never refused naming one of its parameters; before, 25 such requests were, all with 422."""
    org = fuzz_harness.new_org(limit=10_000)
    fuzz_harness.runner.run_to_end(fuzz_harness.create_job(org)["id"])
    app = create_app(fuzz_harness.settings)
    app.state.services = fuzz_harness.services
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    refused: list[tuple[str, str, str]] = []
    sent: Counter[str] = Counter()
    for operation in (result.ok() for result in schema.get_all_operations()):
        parameters = {parameter.name for parameter in operation.iter_parameters()
                      if parameter.location in ("path", "query")}

        @given(case=operation.as_strategy(generation_mode=GenerationMode.POSITIVE))
        @settings(max_examples=EXAMPLES_PER_OPERATION_AND_MODE, deadline=None, derandomize=True,
                  phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck), database=None)
        def call_operation(case) -> None:  # noqa: ANN001
            response = case.call(headers=org.headers)
            sent[operation.label] += 1
            if response.status_code in (400, 422):
                for error in response.json().get("errors") or []:
                    if error.get("field") in parameters:
                        refused.append((operation.label, error["field"], error.get("message", "")))

        call_operation()
    assert len(sent) >= 20 and all(sent.values()), sent
    assert not refused, sorted(set(refused))[:20]
    document = fuzz_harness.client.get("/openapi.json").json()
    job_id = next(p for p in document["paths"]["/v1/jobs/{job_id}"]["get"]["parameters"] if p["name"] == "job_id")
    assert "\\x00-\\x1f" in job_id["schema"]["pattern"]  # the control-character rule, stated on every path parameter


def test_the_documented_month_is_the_month_the_api_accepts():
    """GET /v1/usage's `period` pattern (domain/usage.py PERIOD_PATTERN) and parse_period agree at every edge."""
    import re

    from domain.errors import InvalidRequest
    from domain.usage import PERIOD_PATTERN, parse_period

    def accepted(period: str) -> bool:
        try:
            parse_period(period)
            return True
        except InvalidRequest:
            return False

    for period in ("1969-12", "1970-01", "1999-12", "2026-00", "2026-01", "2026-12", "2026-13", "9998-12", "9999-10",
                   "9999-11", "9999-12", "0000-01", "12026-01"):
        assert (re.fullmatch(PERIOD_PATTERN, period) is not None) == accepted(period), period
    assert accepted("2026-1") and not re.fullmatch(PERIOD_PATTERN, "2026-1")  # one spelling documented, both taken
