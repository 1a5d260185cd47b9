"""Property-based fuzzing against PostgreSQL (issue 13): whatever arrives, the API answers 4xx or 2xx, never
5xx, and never slower than SLOW_RESPONSE_SECONDS (generous on purpose: it catches stalls, not slowness).

- `test_hostile_requests`: Hypothesis strategies for each class of hostile input the issue lists (integers
  beyond 64 bits, control characters and lone surrogates in bodies, paths, query values and headers, deep
  and huge JSON, wrong media types, non-ASCII Authorization, huge Last-Event-ID) thrown at every route.
- `test_schemathesis_negative`: every operation of our OpenAPI document with schema-violating data.
- `test_schemathesis_stateful`: sequences that follow links (create a job, then read, cancel, resume it;
  register a webhook, then change, list and delete it), positive and negative data mixed.

CI runs the derandomised `ci` profile (fixed examples, under a minute on 2 cores). For a longer, random
run: DRAFTSMITH_FUZZ_PROFILE=thorough python -m pytest tests/api/test_api_fuzz.py.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
import schemathesis
from api_harness import Harness, Org, build_harness, make_settings
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from api.main import create_app

SLOW_RESPONSE_SECONDS = 10.0
PROFILES = {
    "ci": {"hostile": 1000, "negative": 25, "stateful": 25, "steps": 8, "derandomize": True},
    "thorough": {"hostile": 10000, "negative": 250, "stateful": 250, "steps": 12, "derandomize": False},
}
PROFILE = PROFILES[os.environ.get("DRAFTSMITH_FUZZ_PROFILE", "ci")]
FUZZ_SETTINGS = dict(deadline=None, database=None, derandomize=PROFILE["derandomize"],
                     suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])


@pytest.fixture(scope="module")
def pg_harness(module_postgres_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    """One app on a PostgreSQL database of its own (what the fuzzer leaves behind, e.g. pending webhook
    deliveries, stays out of other tests); short SSE streams so a generated Accept header cannot hold a run."""
    storage = tmp_path_factory.mktemp("fuzz") / "storage"
    yield from build_harness(make_settings(module_postgres_url, storage, sse_max_stream_seconds=0.3))


@pytest.fixture(scope="module")
def world(pg_harness: Harness) -> dict[str, Any]:
    """Things to point at: a finished job (events, metrics, artifacts), a running one, a webhook, a file, an
    audit."""
    org = pg_harness.new_org()
    finished = pg_harness.create_job(org)["id"]
    pg_harness.runner.run_to_end(finished)
    running = pg_harness.create_job(org)["id"]
    pg_harness.runner.run_stage(running, finish=False)
    # A loopback receiver: the harness allows it, and it needs no name resolved (module fixtures run outside the
    # test's own resolver stand-in).
    hook = pg_harness.client.post("/v1/webhooks", headers=org.headers, json={"url": "http://127.0.0.1:9/hook"})
    upload = pg_harness.client.post("/v1/files", headers=org.headers, files={"file": ("p.jsonl", b'{"prompt": "a"}')})
    audit = pg_harness.client.post("/v1/audits", headers=org.headers,
                                   json={"drafter": "hf://acme/drafter", "target": {"uri": "bundled:smollm2-135m"}})
    return {"org": org, "job": finished, "running": running, "hook": hook.json()["id"], "file": upload.json()["id"],
            "artifact": "validation_report.json", "audit": audit.json()["id"]}


def check(response: Any, elapsed: float, what: str) -> None:
    assert response.status_code < 500, f"{what} -> {response.status_code}: {response.text[:500]}"
    assert elapsed < SLOW_RESPONSE_SECONDS, f"{what} took {elapsed:.1f}s"


# --------------------------------------------------------------------------- strategies, one per class
CONTROL_CHARACTERS = ["\x00", "\x01", "\x08", "\x0b", "\x1b", "\x7f", "\x85", "\x9f", "\ud800", "\udfff"]
odd_text = st.one_of(
    st.text(max_size=40),
    st.builds(lambda a, c, b: a + c + b, st.text(max_size=8), st.sampled_from(CONTROL_CHARACTERS), st.text(max_size=8)),
    st.sampled_from(["", " ", "../../etc/passwd", "%00", "%2e%2e%2f", "' OR 1=1 --", "\u202eevil", "😀" * 30,
                     "x" * 5000, "job_01" + "Z" * 24, "file-" + "a" * 64, "dsk_" + "A" * 43]),
)
huge_ints = st.one_of(
    st.sampled_from([-1, 2**31, 2**32, 2**53 + 1, 2**62 + 1, 2**63 - 1, 2**63, -(2**63) - 1, 2**64, 10**30]),
    st.integers(),
)
odd_numbers = st.one_of(huge_ints, st.floats(allow_nan=True, allow_infinity=True), st.just(5e-324), st.just(1e308))
json_scalars = st.one_of(st.none(), st.booleans(), odd_numbers, odd_text)
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)), max_leaves=8)
SPEC_FIELDS = [("name",), ("target", "uri"), ("target", "allow_pickle"), ("sampling", "seed"),
               ("sampling", "top_k"), ("sampling", "temperature"), ("sampling", "chat_template", "system_prompt"),
               ("drafter", "block_size"), ("drafter", "mask_token_id"), ("drafter", "target_layer_ids"),
               ("data", "source"), ("data", "count"), ("data", "holdout_share"), ("training", "max_steps"),
               ("training", "max_minutes"), ("training", "learning_rate"), ("labels",), ("publish",)]
AUDIT_FIELDS = [("drafter",), ("target", "uri"), ("target", "trust_remote_code"), ("sampling", "seed"),
                ("sampling", "temperature"), ("data", "count"), ("validation", "prompts"), ("thresholds", "min_tau"),
                ("thresholds", "keep_min_gain_ratio"), ("reference_tau",)]
CONTENT_TYPES = ["application/json", "application/json; charset=utf-16", "text/plain", "application/xml",
                 "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/merge-patch+json",
                 "", "application/json; charset=latin-1"]


@st.composite
def spec_bodies(draw: st.DrawFn, audit: bool = False) -> bytes:
    """A job spec (an audit spec with `audit`) with one field made hostile, or the whole body."""
    spec: dict[str, Any] = {"target": {"uri": "bundled:smollm2-135m"}}
    if audit:
        spec["drafter"] = "hf://acme/drafter"
    field = draw(st.sampled_from(AUDIT_FIELDS if audit else SPEC_FIELDS))
    node = spec
    for part in field[:-1]:
        node = node.setdefault(part, {})
    node[field[-1]] = draw(json_values)
    text = json.dumps(spec, allow_nan=True)
    kind = draw(st.sampled_from(["plain", "deep", "huge-int", "raw"]))
    if kind == "deep":
        depth = draw(st.integers(20, 5000))
        text = text[:-1] + ', "labels": ' + '{"a": ' * depth + "1" + "}" * depth + "}"
    elif kind == "huge-int":
        text = text[:-1] + ', "sampling": {"seed": 1' + "0" * draw(st.integers(19, 6000)) + "}}"
    elif kind == "raw":
        return draw(st.binary(max_size=200))
    return text.encode("utf-8", "surrogatepass")


@st.composite
def hostile_requests(draw: st.DrawFn, world: dict[str, Any]) -> dict[str, Any]:
    ids = {key: world[key] for key in ("job", "running", "hook", "file", "artifact", "audit")}
    ids["name"] = "hub-token"
    ids["drafter"] = "drf_" + "0" * 26
    routes = [
        ("GET", "/v1/jobs/{job}"), ("GET", "/v1/jobs"), ("GET", "/v1/jobs/{job}/events"),
        ("GET", "/v1/jobs/{running}/events"), ("GET", "/v1/jobs/{job}/metrics"), ("GET", "/v1/jobs/{job}/artifacts"),
        ("GET", "/v1/jobs/{job}/artifacts/{artifact}"), ("GET", "/v1/files"), ("GET", "/v1/files/{file}"),
        ("GET", "/v1/webhooks"), ("GET", "/v1/webhooks/{hook}"), ("GET", "/v1/webhooks/{hook}/deliveries"),
        ("GET", "/v1/secrets"), ("POST", "/v1/jobs"), ("POST", "/v1/jobs/estimate"), ("POST", "/v1/jobs/{job}/cancel"),
        ("POST", "/v1/jobs/{job}/resume"), ("POST", "/v1/webhooks"), ("PATCH", "/v1/webhooks/{hook}"),
        ("PUT", "/v1/secrets/{name}"), ("DELETE", "/v1/secrets/{name}"), ("POST", "/v1/files"), ("GET", "/readyz"),
        ("POST", "/v1/audits"), ("GET", "/v1/audits"), ("GET", "/v1/audits/{audit}"),
        ("POST", "/v1/audits/{audit}/cancel"), ("GET", "/v1/audit-thresholds"), ("PUT", "/v1/audit-thresholds"),
        ("GET", "/v1/drafters"), ("GET", "/v1/drafters/{drafter}"), ("GET", "/v1/usage"), ("GET", "/healthz"),
        ("GET", "/metrics"),
    ]
    method, template = draw(st.sampled_from(routes))
    segments = {key: value for key, value in ids.items()}
    if "{" in template and draw(st.booleans()):  # one path segment replaced by something hostile
        key = template.split("{", 1)[1].split("}", 1)[0]
        segments[key] = draw(st.one_of(odd_text, huge_ints.map(str)))
    path = template.format(**{k: quote(str(v).encode("utf-8", "surrogatepass"), safe="") for k, v in segments.items()})
    query = draw(st.lists(st.tuples(
        st.sampled_from(["after", "limit", "status", "label", "name", "step_min", "step_max", "max_points",
                         "gpu_class", "gpu_count", "target_parameters_billion", "api_key", "drafter"]),
        st.one_of(odd_text, odd_numbers.map(str))), max_size=3))
    if query:  # encoded here: a lone surrogate is not UTF-8, and the client library would refuse it
        path += "?" + "&".join(f"{key}={quote(value.encode('utf-8', 'surrogatepass'), safe='')}" for key, value in query)
    headers = dict(world["org"].headers)
    header_case = draw(st.sampled_from(["none", "auth", "last-event-id", "idempotency", "accept"]))
    if header_case == "auth":
        headers["Authorization"] = draw(st.one_of(odd_text, st.just("Bearer dsk_\xe9" + "a" * 40))).encode(
            "utf-8", "surrogatepass").replace(b"\r", b"").replace(b"\n", b"")
    elif header_case == "last-event-id":
        headers["Last-Event-ID"] = draw(st.one_of(huge_ints.map(str), st.just("9" * 32), odd_text)).encode(
            "utf-8", "surrogatepass").replace(b"\r", b"").replace(b"\n", b"")
        headers["Accept"] = "text/event-stream"
    elif header_case == "idempotency":
        headers["Idempotency-Key"] = draw(odd_text).encode("utf-8", "surrogatepass").replace(b"\r", b"").replace(
            b"\n", b"")
    elif header_case == "accept":
        headers["Accept"] = "text/event-stream"
    body = None
    if method in ("POST", "PUT", "PATCH"):
        body = draw(spec_bodies(audit=template.startswith("/v1/audit")))
        headers["Content-Type"] = draw(st.sampled_from(CONTENT_TYPES))
        if not headers["Content-Type"]:
            del headers["Content-Type"]
    return {"method": method, "path": path, "headers": headers, "body": body}


def test_hostile_requests(pg_harness: Harness, world: dict[str, Any]):
    statuses: dict[int, int] = {}

    @given(request=hostile_requests(world))
    @settings(max_examples=PROFILE["hostile"], **FUZZ_SETTINGS)
    def send(request: dict[str, Any]) -> None:
        started = time.monotonic()
        response = pg_harness.client.request(
            request["method"], request["path"], headers=request["headers"], content=request["body"])
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        check(response, time.monotonic() - started, f"{request['method']} {request['path']}")

    send()
    assert sum(n for status, n in statuses.items() if status in (400, 401, 404, 413, 415, 422)) > 50, statuses
    print(f"hostile requests: {dict(sorted(statuses.items()))}")


def _schema(harness: Harness) -> Any:
    app = create_app(harness.settings)
    app.state.services = harness.services
    document = app.openapi()
    _add_links(document)
    return schemathesis.openapi.from_asgi("/openapi.json", app)


def _add_links(document: dict[str, Any]) -> None:
    """OpenAPI links from what creates a resource to what uses it, for stateful sequences."""
    job = {"job_id": "$response.body#/id"}
    hook = {"webhook_id": "$response.body#/id"}
    targets = {
        ("/v1/jobs", "post", "201"): [("/v1/jobs/{job_id}", "get", job), ("/v1/jobs/{job_id}/cancel", "post", job),
                                       ("/v1/jobs/{job_id}/resume", "post", job),
                                       ("/v1/jobs/{job_id}/events", "get", job),
                                       ("/v1/jobs/{job_id}/metrics", "get", job)],
        ("/v1/jobs/{job_id}/cancel", "post", "200"): [("/v1/jobs/{job_id}/resume", "post", job)],
        ("/v1/webhooks", "post", "201"): [("/v1/webhooks/{webhook_id}", "get", hook),
                                          ("/v1/webhooks/{webhook_id}", "patch", hook),
                                          ("/v1/webhooks/{webhook_id}/deliveries", "get", hook),
                                          ("/v1/webhooks/{webhook_id}", "delete", hook)],
    }
    paths = document["paths"]
    for (path, method, status), links in targets.items():
        response = paths[path][method]["responses"].setdefault(status, {"description": "ok"})
        response["links"] = {
            f"{target_method}{target_path.replace('/', '_').replace('{', '').replace('}', '')}": {
                "operationRef": f"#/paths/{target_path.replace('/', '~1')}/{target_method}",
                "parameters": parameters,
            }
            for target_path, target_method, parameters in links
        }


def test_schemathesis_negative(pg_harness: Harness, world: dict[str, Any]):
    org: Org = world["org"]
    schema = _schema(pg_harness)
    operations = 0
    for result in schema.get_all_operations():
        operation = result.ok()

        @given(case=operation.as_strategy(generation_mode=GenerationMode.NEGATIVE))
        @settings(max_examples=PROFILE["negative"], **FUZZ_SETTINGS)
        def call(case: Any) -> None:
            started = time.monotonic()
            response = case.call(headers=org.headers)
            check(response, time.monotonic() - started, operation.label)
            case.validate_response(response, checks=[not_a_server_error])

        try:
            call()
        except Unsatisfiable:
            continue  # nothing to make invalid (no parameters, no body)
        operations += 1
    assert operations >= 15


def test_schemathesis_stateful(pg_harness: Harness):
    schema = _schema(pg_harness)
    schema.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
    calls: list[str] = []

    class Machine(schema.as_state_machine()):  # type: ignore[misc]
        def setup(self) -> None:
            # A fresh organisation per sequence: every sequence starts from the same state (no jobs, no
            # webhooks, limits untouched), so the same choices meet the same answers, as Hypothesis requires.
            self.org: Org = pg_harness.new_org()

        def get_call_kwargs(self, case: Any) -> dict[str, Any]:
            return {"headers": self.org.headers}

        def call(self, case: Any, **kwargs: Any) -> Any:
            started = time.monotonic()
            response = case.call(**kwargs)
            check(response, time.monotonic() - started, case.operation.label)
            calls.append(f"{case.operation.label} {response.status_code}")
            return response

        def validate_response(self, response: Any, case: Any, additional_checks: Any = None, **kwargs: Any) -> None:
            case.validate_response(response, checks=[not_a_server_error])

    Machine.run(settings=settings(max_examples=PROFILE["stateful"], stateful_step_count=PROFILE["steps"],
                                  **FUZZ_SETTINGS))
    linked = [c for c in calls if "{job_id}" in c or "{webhook_id}" in c]
    assert linked, calls  # links were followed, not only random calls
    print(f"stateful: {len(calls)} calls, {len(linked)} along links")
