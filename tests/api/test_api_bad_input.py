"""Hostile and broken input: each is refused with a problem naming what to fix, never a 500, and
nothing is written (row counts and stored files unchanged). SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

MINIMAL = {"target": {"uri": "bundled:smollm2-135m"}}


def stored_files(harness) -> list[str]:
    root = harness.services.storage.root
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) if root.exists() else []


@pytest.mark.parametrize(
    ("uri", "fragment"),
    [
        ("file:///etc/passwd", "outside the allowed roots"),
        ("file:///srv/models/../../etc/passwd", "'..'"),
        ("file:///srv/models/%2e%2e/secrets", "'..'"),
        ("file:///srv/modelsX/evil", "outside the allowed roots"),
        ("file://host/srv/models/x", "absolute"),
        ("file:relative/path", "not a URI"),
        ("http://example.com/model", "unsupported URI scheme 'http'"),
        ("gs://bucket/model", "unsupported URI scheme 'gs'"),
        ("hf://org/../name", "Hugging Face repo id"),
        ("hf://org/name@../../x", "revision"),
        ("s3://Bad_Bucket/x", "S3 bucket"),
        ("s3://bucket/a/../../b", "'..'"),
        (" bundled:smollm2-135m", "whitespace"),
    ],
)
def test_bad_target_uris(harness, uri, fragment):
    org = harness.new_org()
    before = harness.row_counts()
    response = harness.client.post("/v1/jobs", json={"target": {"uri": uri}}, headers=org.headers)
    assert response.status_code == 422, response.text
    error = response.json()["errors"][0]
    assert error["field"] == "target.uri" and fragment in error["message"], error
    assert harness.row_counts() == before


def test_file_uri_inside_allowed_root_is_accepted(harness):
    org = harness.new_org()
    response = harness.client.post("/v1/jobs", json={"target": {"uri": "file:///srv/models/acme-8b"},
                                                     "data": {"source": "s3://prompts-bucket/set.jsonl"}},
                                   headers=org.headers)
    assert response.status_code == 201, response.text
    # The stored spec is readable back even after the deployment's roots change.
    assert harness.client.get(f"/v1/jobs/{response.json()['id']}", headers=org.headers).status_code == 200


def test_malformed_bodies(harness):
    org = harness.new_org()
    before = harness.row_counts()
    cases = [
        (b"{not json", "application/json", "body"),
        (b"[1, 2]", "application/json", "body"),
        (b"", "application/json", "body"),
        (b'{"target": {"uri": "bundled:smollm2-135m"}}\xff', "application/json", "body"),
    ]
    for raw, content_type, field in cases:
        response = harness.client.post("/v1/jobs", content=raw, headers={**org.headers, "Content-Type": content_type})
        assert response.status_code == 422, (raw, response.text)
        assert response.json()["errors"][0]["field"] == field
    huge = b'{"target": {"uri": "bundled:smollm2-135m"}, "name": "' + b"x" * (2 << 20) + b'"}'
    response = harness.client.post("/v1/jobs", content=huge, headers={**org.headers, "Content-Type": "application/json"})
    assert response.status_code == 413 and response.headers["content-type"] == "application/problem+json"
    # Without Content-Length (chunked), the limit is enforced while the body streams in.
    chunks = iter([b'{"target": {"uri": "bundled:smollm2-135m"}, "name": "'] + [b"x" * 65536] * 40 + [b'"}'])
    response = harness.client.post("/v1/jobs", content=chunks, headers={**org.headers, "Content-Type": "application/json"})
    assert response.status_code == 413 and response.json()["type"].endswith("payload-too-large")
    assert harness.row_counts() == before


def test_prompt_file_upload_validation(harness):
    org = harness.new_org()
    before, files_before = harness.row_counts(), stored_files(harness)
    bad = b'{"prompt": "ok"}\n{"prompt": \n{"messages": [{"role": "robot", "content": "x"}]}\n\n[1]\n'
    response = harness.client.post("/v1/files", headers=org.headers,
                                   files={"file": ("bad.jsonl", bad, "application/jsonl")})
    assert response.status_code == 422
    problem = response.json()
    assert problem["detail"].startswith("line 2: malformed JSON")
    assert [(e["field"], e["line"]) for e in problem["errors"]] == [("file", 2), ("file", 3), ("file", 5)]
    assert "messages.0.role" in problem["errors"][1]["message"]

    for content, fragment in ((b"", "no prompts"), (b'{"prompt": "a", "messages": [{"role": "user", "content": "b"}]}\n', "exactly one"),
                              (b'{"messages": [{"role": "system", "content": "s"}]}', "role \"user\""),
                              (b'\xff\xfe{"prompt": "x"}', "UTF-8")):
        response = harness.client.post("/v1/files", headers=org.headers, files={"file": ("p.jsonl", content)})
        assert response.status_code == 422 and fragment in response.json()["errors"][0]["message"], response.text

    limit = harness.settings.max_upload_bytes
    line = b'{"prompt": "' + b"y" * 1000 + b'"}\n'
    too_big = line * (limit // len(line) + 1)
    response = harness.client.post("/v1/files", headers=org.headers, files={"file": ("big.jsonl", too_big)})
    assert response.status_code == 413 and response.json()["type"].endswith("payload-too-large")
    far_too_big = line * (4 * limit // len(line))  # beyond the multipart allowance: refused before parsing
    response = harness.client.post("/v1/files", headers=org.headers, files={"file": ("big.jsonl", far_too_big)})
    assert response.status_code == 413 and response.headers["content-type"] == "application/problem+json"
    response = harness.client.post("/v1/files", headers=org.headers, files={"file": ("p.jsonl", b"{}")},
                                   data={"purpose": "fine-tune"})
    assert response.status_code == 422 and response.json()["errors"][0]["field"] == "purpose"
    assert harness.row_counts() == before and stored_files(harness) == files_before

    good = harness.client.post("/v1/files", headers=org.headers,
                               files={"file": ("../../good.jsonl", b'{"prompt": "a"}\r\n\n{"prompt": "b"}')})
    assert good.status_code == 201, good.text
    body = good.json()
    assert body["id"].startswith("file-") and body["prompt_count"] == 2 and body["filename"] == "good.jsonl"
    assert harness.client.get(f"/v1/files/{body['id']}", headers=org.headers).json() == body
    assert harness.client.get(f"/v1/files/{body['id']}", headers=harness.new_org().headers).status_code == 404


def test_authentication_and_scopes(harness):
    org = harness.new_org()
    job_id = harness.create_job(org)["id"]
    read_only = harness.key_for(org, ("read",))
    before = harness.row_counts()
    for headers, status in (
        ({}, 401),
        ({"Authorization": "Bearer"}, 401),
        ({"Authorization": "Basic dXNlcjpwYXNz"}, 401),
        ({"Authorization": "Bearer not-a-key"}, 401),
        ({"Authorization": "Bearer dsk_" + "A" * 43}, 401),
        ({"Authorization": "Bearer " + harness.settings.dev_api_key.get_secret_value()}, 401),  # not development
        (read_only, 403),
    ):
        for method, path, kwargs in (
            ("POST", "/v1/jobs", {"json": MINIMAL}),
            ("POST", f"/v1/jobs/{job_id}/cancel", {}),
            ("POST", "/v1/files", {"files": {"file": ("p.jsonl", b'{"prompt": "x"}')}}),
            ("POST", "/v1/webhooks", {"json": {"url": "https://example.com/hook"}}),
        ):
            response = harness.client.request(method, path, headers=headers, **kwargs)
            assert response.status_code == status, (headers, path, response.text)
            assert response.headers["content-type"] == "application/problem+json"
            if status == 401:
                assert response.headers["www-authenticate"].startswith("Bearer")
            else:
                assert "needs 'write'" in response.json()["detail"] or "needs 'admin'" in response.json()["detail"]
    assert harness.client.get(f"/v1/jobs/{job_id}", headers=read_only).status_code == 200
    assert harness.client.get("/v1/webhooks", headers=read_only).status_code == 403  # webhooks are admin
    assert harness.row_counts() == before


def test_revoked_key_is_refused(harness):
    from domain.models import ApiKey, utcnow

    org = harness.new_org()
    assert harness.client.get("/v1/jobs", headers=org.headers).status_code == 200
    with harness.services.session_factory() as session:
        for key in session.query(ApiKey).filter(ApiKey.org_id == org.org_id):
            key.revoked_at = utcnow()
        session.commit()
    response = harness.client.get("/v1/jobs", headers=org.headers)
    assert response.status_code == 401 and "revoked" in response.json()["detail"]


def test_unknown_routes_and_methods_are_problems(harness):
    org = harness.new_org()
    missing = harness.client.get("/v1/nothing", headers=org.headers)
    assert missing.status_code == 404 and missing.headers["content-type"] == "application/problem+json"
    wrong = harness.client.delete("/v1/jobs", headers=org.headers)
    assert wrong.status_code == 405 and wrong.json()["status"] == 405
