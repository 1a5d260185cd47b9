"""Property-based fuzzing of every operation in our own OpenAPI document (schemathesis, ASGI transport):
whatever it generates, valid or deliberately invalid, the API never answers 5xx.

Bounded: a fixed number of examples per operation and mode, no shrinking phase, derandomised, so
the run is reproducible and takes well under a minute on a quiet 2-core machine (printed, not asserted:
speed targets live in bench/). (schemathesis' own
pytest plugin does not support pytest 9 yet, so each operation's strategy is driven directly.)
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from api.main import create_app
from api_harness import Harness, build_harness, make_settings

EXAMPLES_PER_OPERATION_AND_MODE = 25


@pytest.fixture
def fuzz_harness(sqlite_url: str, tmp_path: Path) -> Iterator[Harness]:
    # Short SSE streams: a generated `Accept: text/event-stream` must not hold the run up.
    yield from build_harness(make_settings(sqlite_url, tmp_path / "storage", sse_max_stream_seconds=0.3))


def test_no_server_errors(fuzz_harness: Harness):
    org = fuzz_harness.new_org()
    finished = fuzz_harness.create_job(org)["id"]
    fuzz_harness.runner.run_to_end(finished)  # so artifacts, metrics and events exist to be fetched
    fuzz_harness.runner.run_stage(fuzz_harness.create_job(org)["id"], finish=False)
    app = create_app(fuzz_harness.settings)
    app.state.services = fuzz_harness.services
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)

    started = time.monotonic()
    exercised: list[str] = []
    statuses: Counter[int] = Counter()
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(max_examples=EXAMPLES_PER_OPERATION_AND_MODE, deadline=None, derandomize=True,
                      phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck),
                      database=None)
            def call_operation(case) -> None:  # noqa: ANN001
                response = case.call(headers=org.headers)
                statuses[response.status_code] += 1
                case.validate_response(response, checks=[not_a_server_error])

            try:
                call_operation()
            except Unsatisfiable:
                # An operation without parameters or body (GET /healthz) has no invalid variant to make.
                assert mode is GenerationMode.NEGATIVE, operation.label
                continue
            exercised.append(f"{operation.label} [{mode.value}]")
    elapsed = time.monotonic() - started
    operations = {label.split(" [")[0] for label in exercised}
    assert len(operations) >= 20, operations  # every route was fuzzed, not silently skipped
    assert sum(label.endswith("[negative]") for label in exercised) >= 12  # and invalid input was sent
    successes = sum(n for status, n in statuses.items() if status < 300)
    assert successes > 0.05 * statuses.total(), statuses  # authenticated, and reaching the handlers
    print(f"fuzzed {len(exercised)} operation modes in {elapsed:.1f}s: {dict(statuses)}")


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
