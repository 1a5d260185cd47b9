"""Issue 20 at the API, on PostgreSQL with S3 storage in a real `moto_server`: no URI-bearing field of a job, an
estimate or an audit reaches another organisation's objects in the deployment's own storage (target, data
source, warm start, audit drafter, publish destination), however it is spelled; an organisation's own objects
stay usable; the service's storage is never a publish destination; other buckets are published to only with the
organisation's own credentials. And in the embedded mode, the same through file:// into the local storage root.

The same hostile specs injected straight into the database are refused again by the worker:
tests/worker/test_worker_tenancy.py."""

from __future__ import annotations

import json
from collections.abc import Iterator

import boto3
import pytest
from api_harness import Harness, build_harness, make_settings
from services import moto_server

BUCKET = "draftsmith-tenancy"
MINIMAL = {"target": {"uri": "bundled:smollm2-135m"}}


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    with moto_server() as endpoint:
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                     aws_secret_access_key="testing").create_bucket(Bucket=BUCKET)
        yield endpoint


@pytest.fixture
def s3_harness(module_postgres_url, s3_endpoint, tmp_path) -> Iterator[Harness]:
    yield from build_harness(make_settings(
        module_postgres_url, tmp_path / "unused", storage_url=f"s3://{BUCKET}/service", s3_endpoint_url=s3_endpoint,
        s3_access_key_id="testing", s3_secret_access_key="testing", s3_trusted_buckets=["shared-models"]))


def a_with_objects(harness: Harness) -> tuple[object, str, str]:
    """Organisation A with an upload and a finished job: its objects are in the deployment's bucket."""
    a = harness.new_org()
    upload = harness.client.post("/v1/files", files={"file": ("p.jsonl", b'{"prompt": "private to A"}\n' * 24)},
                                 headers=a.headers)
    assert upload.status_code == 201, upload.text
    job_id = harness.create_job(a)["id"]
    harness.runner.run_to_end(job_id)
    return a, upload.json()["id"], job_id


def hostile_bodies(a_org: str, a_file: str, a_job: str) -> list[tuple[str, str, dict]]:
    """(path, field the refusal must name, body) for every URI-bearing field, aimed at A's objects."""
    base = f"s3://{BUCKET}/service"
    files, work, artifacts = f"{base}/files/{a_org}/{a_file}.jsonl", f"{base}/jobs/{a_job}/work", \
        f"{base}/jobs/{a_job}/artifacts"
    return [
        ("/v1/jobs", "target.uri", {"target": {"uri": work}}),
        ("/v1/jobs", "data.source", {**MINIMAL, "data": {"source": files}}),
        ("/v1/jobs", "init.from_drafter", {**MINIMAL, "init": {"from_drafter": artifacts}}),
        ("/v1/jobs", "publish.0.uri", {**MINIMAL, "publish": [{"kind": "s3", "uri": artifacts, "private": False}]}),
        ("/v1/jobs/estimate", "data.source", {**MINIMAL, "data": {"source": files}}),
        ("/v1/audits", "drafter", {"drafter": artifacts, "target": {"uri": "bundled:smollm2-135m"}}),
        ("/v1/audits", "data.source", {"drafter": "hf://acme/drafter", "target": {"uri": "bundled:smollm2-135m"},
                                       "data": {"source": files}}),
        # Other spellings of the same objects.
        ("/v1/jobs", "data.source", {**MINIMAL, "data": {"source": files.replace("/files/", "//files/")}}),
        ("/v1/jobs", "data.source", {**MINIMAL, "data": {"source": files.replace("/files/", "/files%2F")}}),
        ("/v1/jobs", "target.uri", {"target": {"uri": work.replace(f"s3://{BUCKET}", f"s3://{BUCKET}.s3.amazonaws.com")}}),
        ("/v1/jobs", "target.uri", {"target": {"uri": work.replace(f"s3://{BUCKET}", f"s3://localhost/{BUCKET}")}}),
        # Numeric spellings of the storage host (issue 32): 127.1, its integer, octal, hex.
        *(("/v1/jobs", "data.source", {**MINIMAL, "data": {"source": files.replace("s3://", f"s3://{host}/")}})
          for host in ("127.1", "2130706433", "0177.0.0.1", "0x7f000001")),
        ("/v1/jobs/estimate", "data.source", {**MINIMAL, "data": {"source": files.replace("s3://", "s3://0x7f.1/")}}),
    ]


def test_no_uri_field_reaches_another_organisations_objects(s3_harness):
    harness = s3_harness
    a, a_file, a_job = a_with_objects(harness)
    b = harness.new_org()
    s3 = boto3.client("s3", endpoint_url=harness.settings.s3_endpoint_url, region_name="us-east-1",
                      aws_access_key_id="testing", aws_secret_access_key="testing")
    objects_before = {o["Key"]: o["ETag"] for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"]}
    rows_before = harness.row_counts()
    for path, field, body in hostile_bodies(a.org_id, a_file, a_job):
        response = harness.client.post(path, json=body, headers=b.headers)
        assert response.status_code == 422, (path, body, response.text)
        fields = [e["field"] for e in response.json()["errors"]]
        assert field in fields, (path, body, response.json())
        message = next(e["message"] for e in response.json()["errors"] if e["field"] == field)
        assert "Draftsmith's own storage" in message or "spells" in message, message
    assert harness.row_counts() == rows_before  # nothing admitted, nothing queued
    assert {o["Key"]: o["ETag"] for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"]} == objects_before

    # A's own objects are A's to use by URI (read), but the service's storage is never a destination.
    own = f"s3://{BUCKET}/service"
    reuse = {**MINIMAL, "data": {"source": f"{own}/files/{a.org_id}/{a_file}.jsonl"},
             "init": {"from_drafter": f"{own}/jobs/{a_job}/artifacts"}}
    assert harness.client.post("/v1/jobs", json=reuse, headers=a.headers).status_code == 201
    overwrite = {**MINIMAL, "publish": [{"kind": "s3", "uri": f"{own}/jobs/{a_job}/artifacts"}]}
    refused = harness.client.post("/v1/jobs", json=overwrite, headers=a.headers)
    assert refused.status_code == 422 and "only the service writes" in refused.text


def test_other_buckets_are_published_to_with_the_organisations_own_credentials_only(s3_harness):
    harness = s3_harness
    b = harness.new_org()
    elsewhere = {**MINIMAL, "publish": [{"kind": "s3", "uri": "s3://b-releases/drafters"}]}
    refused = harness.client.post("/v1/jobs", json=elsewhere, headers=b.headers)
    assert refused.status_code == 422, refused.text
    error = refused.json()["errors"][0]
    assert error["field"] == "publish.0.credentials_secret" and "needs your own credentials" in error["message"]
    # The operator's trusted bucket takes the deployment's credentials; the organisation's secret opens its own.
    trusted = {**MINIMAL, "publish": [{"kind": "s3", "uri": "s3://shared-models/b"}]}
    assert harness.client.post("/v1/jobs", json=trusted, headers=b.headers).status_code == 201
    secret = json.dumps({"access_key_id": "b-key", "secret_access_key": "b-secret-value-0123"})
    assert harness.client.put("/v1/secrets/s3.b-releases", json={"value": secret}, headers=b.headers).status_code == 200
    assert harness.client.post("/v1/jobs", json=elsewhere, headers=b.headers).status_code == 201
    # Reads from other buckets never need the deployment's credentials (anonymous, or the organisation's own).
    assert harness.client.post("/v1/jobs", json={**MINIMAL, "data": {"source": "s3://public-prompts/p.jsonl"}},
                               headers=b.headers).status_code == 201


def test_file_uris_into_the_embedded_storage_root(sqlite_url, tmp_path):
    root = tmp_path / "data"
    for harness in build_harness(make_settings(sqlite_url, root / "storage", allowed_file_roots=[str(root)])):
        a, b = harness.new_org(), harness.new_org()
        upload = harness.client.post("/v1/files", files={"file": ("p.jsonl", b'{"prompt": "A"}\n' * 10)},
                                     headers=a.headers).json()
        stored = root / "storage" / "files" / a.org_id / f"{upload['id']}.jsonl"
        assert stored.is_file()
        link = root / "models"
        link.symlink_to(root / "storage" / "files" / a.org_id)  # a link inside the allowed root, into A's files
        for uri in (stored.as_uri(), f"file://{link}/{upload['id']}.jsonl", f"file://{root}/storage/files"):
            response = harness.client.post("/v1/jobs", json={**MINIMAL, "data": {"source": uri}}, headers=b.headers)
            assert response.status_code == 422 and response.json()["errors"][0]["field"] == "data.source", uri
        own = harness.client.post("/v1/jobs", json={**MINIMAL, "data": {"source": stored.as_uri()}}, headers=a.headers)
        assert own.status_code == 201, own.text
