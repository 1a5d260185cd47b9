"""Issue 20 in the worker, on PostgreSQL with S3 storage in a real `moto_server`: specs are stored, so the worker
judges every URI again before it fetches or publishes. A hostile spec injected straight into the database (as a
compromised or hand-edited row would be) names organisation A's objects through every URI-bearing field; the
worker (`run_job`, `execute_audit`, in this process) fails the job with `storage_not_allowed` naming the URI, and
nothing of A's is read into B's job or written over: A's objects are byte for byte what they were.

The API's refusal of the same specs: tests/api/test_api_tenancy.py. Jobs here stop before any model is loaded;
organisation A's objects come from the fake stage runner the API tests use."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from api_harness import Harness, build_harness, make_settings
from services import fresh_postgres_database, moto_server
from sqlalchemy import select

from domain.models import Audit, Job, new_id
from domain.queue import all_queues
from domain.states import Stage
from schemas.job_spec import JobSpec

BUCKET, OTHER_BUCKET = "draftsmith-w-tenancy", "b-other-bucket"
MINIMAL = {"target": {"uri": "bundled:smollm2-135m"}}


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> Iterator[Harness]:
    from migrations.revisions import upgrade

    url, drop = fresh_postgres_database("draftsmith_worker_tenancy")
    upgrade(url)
    try:
        with moto_server() as endpoint:
            s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                              aws_secret_access_key="testing")
            for bucket in (BUCKET, OTHER_BUCKET):
                s3.create_bucket(Bucket=bucket)
            settings = make_settings(url, tmp_path_factory.mktemp("unused"), storage_url=f"s3://{BUCKET}/service",
                                     s3_endpoint_url=endpoint, s3_access_key_id="testing",
                                     s3_secret_access_key="testing",
                                     worker_cache_dir=str(tmp_path_factory.mktemp("worker-cache")))
            yield from build_harness(settings)
    finally:
        drop()


@pytest.fixture(scope="module")
def ctx(harness):
    from worker.context import WorkerContext

    return WorkerContext(harness.settings, frozenset(all_queues(harness.settings)))


def s3_objects(harness: Harness, bucket: str = BUCKET) -> dict[str, str]:
    s3 = boto3.client("s3", endpoint_url=harness.settings.s3_endpoint_url, region_name="us-east-1",
                      aws_access_key_id="testing", aws_secret_access_key="testing")
    return {o["Key"]: o["ETag"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])}


def inject(harness: Harness, job_id: str, **sections: Any) -> None:
    """Replace a stored job's spec behind the API's back, as a hand-edited row would."""
    with harness.services.session_factory() as session:
        job = session.get(Job, job_id)
        spec = JobSpec.model_validate({**job.spec, **sections}, context={"allowed_file_roots": ["/"]})
        job.spec = spec.model_dump(mode="json")
        session.commit()


def outcome(harness: Harness, job_id: str) -> tuple[str, str | None, str, str | None]:
    with harness.services.session_factory() as session:
        job = session.get(Job, job_id)
        return job.status, job.error_code, job.error_message or "", job.error_stage


@pytest.fixture(scope="module")
def organisation_a(harness):
    a = harness.new_org()
    upload = harness.client.post("/v1/files", files={"file": ("p.jsonl", b'{"prompt": "A only"}\n' * 24)},
                                 headers=a.headers).json()
    job_id = harness.create_job(a)["id"]
    harness.runner.run_to_end(job_id)
    harness.services.storage.put_bytes(f"jobs/{job_id}/work/sources.json", b'{"private": "A"}')
    return a, upload["id"], job_id


def test_hostile_stored_specs_fail_in_the_worker_and_touch_nothing_of_a(harness, ctx, organisation_a):
    from worker.runner import Outcome, run_job

    a, a_file, a_job = organisation_a
    b = harness.new_org()
    base = f"s3://{BUCKET}/service"
    files, artifacts = f"{base}/files/{a.org_id}/{a_file}.jsonl", f"{base}/jobs/{a_job}/artifacts"
    cases = [  # (sections of the injected spec, the URI its error must name)
        ({"target": {"uri": f"{base}/jobs/{a_job}/work"}}, f"{base}/jobs/{a_job}/work"),
        ({"target": {"uri": "bundled:smollm2-135m", "base": f"{base}/jobs/{a_job}/work"}}, f"{base}/jobs/{a_job}/work"),
        ({"data": {"source": files}}, files),
        ({"data": {"source": files.replace("/files/", "//files/")}}, "//files/"),
        ({"data": {"source": files.replace(f"s3://{BUCKET}", f"s3://{BUCKET}.localhost")}}, f"{BUCKET}.localhost"),
        ({"init": {"from_drafter": artifacts}}, artifacts),
    ]
    before = s3_objects(harness)
    sent: list[tuple[str, Stage]] = []
    for sections, named in cases:
        job_id = harness.create_job(b)["id"]
        inject(harness, job_id, **sections)
        assert run_job(ctx, job_id, lambda job, stage: sent.append((job, stage))) is Outcome.FAILED
        status, code, message, stage = outcome(harness, job_id)
        assert (status, code, stage) == ("failed", "storage_not_allowed", "prepare"), (sections, code, message)
        assert named in message and "own storage" in message, message
    assert s3_objects(harness) == before and not sent  # nothing written, read into B's jobs, or handed on
    assert not [p for p in Path(ctx.cache).rglob("*") if a_file in p.name or "A only" in _text(p)]


def a_copies(ctx) -> set[Path]:
    """Files in the worker's cache that hold organisation A's prompts."""
    return {p for p in Path(ctx.cache).rglob("*") if "A only" in _text(p)}


def _text(path: Path) -> str:
    return path.read_text(errors="ignore") if path.is_file() and path.stat().st_size < 1 << 20 else ""


def test_a_hostile_publish_destination_is_refused_before_anything_is_copied(harness, ctx, organisation_a):
    from worker.runner import Outcome, run_job

    a, _, a_job = organisation_a
    b, b2 = harness.new_org(), harness.new_org()
    value = json.dumps({"access_key_id": "b2-key", "secret_access_key": "b2-secret-0123456789"})
    assert harness.client.put(f"/v1/secrets/s3.{OTHER_BUCKET}", json={"value": value},
                              headers=b2.headers).status_code == 200
    a_artifacts = f"s3://{BUCKET}/service/jobs/{a_job}/artifacts"
    cases = [
        (b, [{"kind": "s3", "uri": a_artifacts, "private": False}]),
        (b, [{"kind": "s3", "uri": a_artifacts.replace("/jobs/", "//jobs/")}]),
        (b, [{"kind": "s3", "uri": f"s3://{OTHER_BUCKET}/b"}]),  # no secret of B's: the deployment's are not lent
        # B2 may publish to its own bucket, but not when another destination is A's: nothing is copied anywhere.
        (b2, [{"kind": "s3", "uri": f"s3://{OTHER_BUCKET}/b2"}, {"kind": "s3", "uri": a_artifacts}]),
    ]
    before, other_before = s3_objects(harness), s3_objects(harness, OTHER_BUCKET)
    for org, publish in cases:
        job_id = harness.create_job(org)["id"]
        for _ in range(5):  # prepare .. export: the organisation's own artifacts, by the stage-runner API
            harness.runner.run_stage(job_id)
        inject(harness, job_id, publish=publish)
        assert run_job(ctx, job_id, lambda job, stage: None) is Outcome.FAILED
        status, code, message, stage = outcome(harness, job_id)
        assert (status, code, stage) == ("failed", "storage_not_allowed", "publish"), (publish, message)
        assert "publish[" in message and "b2-secret" not in message
    unchanged = {key: etag for key, etag in s3_objects(harness).items() if f"/jobs/{a_job}/" in key}
    assert unchanged == {key: etag for key, etag in before.items() if f"/jobs/{a_job}/" in key}
    assert s3_objects(harness, OTHER_BUCKET) == other_before == {}


def test_a_hostile_audit_drafter_fails_the_audit(harness, ctx, organisation_a):
    from worker.audits import execute_audit

    a, _, a_job = organisation_a
    b = harness.new_org()
    drafter = f"s3://{BUCKET}/service/jobs/{a_job}/artifacts"
    with harness.services.session_factory() as session:
        audit = Audit(id=new_id("aud_"), org_id=b.org_id, status="queued", drafter_ref=drafter,
                      target_uri="bundled:smollm2-135m", attempts=0,
                      spec={"drafter": drafter, "target": {"uri": "bundled:smollm2-135m"}, "data": {"source": "builtin"}})
        session.add(audit)
        session.commit()
        audit_id = audit.id
    before = s3_objects(harness)
    assert execute_audit(ctx, audit_id) == "failed"
    with harness.services.session_factory() as session:
        row = session.scalar(select(Audit).where(Audit.id == audit_id))
        assert (row.status, row.error_code) == ("failed", "storage_not_allowed") and drafter in row.error_message
    assert s3_objects(harness) == before


def test_the_worker_reads_with_whose_credentials(harness, ctx, organisation_a, monkeypatch):
    from botocore import UNSIGNED

    import worker.sources as sources
    from worker.sources import Caller, SourceUnavailable, open_s3, resolve_prompts

    a, a_file, _ = organisation_a
    caller = Caller(a.org_id, ctx.session_factory)
    own = f"s3://{BUCKET}/service/files/{a.org_id}/{a_file}.jsonl"
    mine = open_s3(own, harness.settings, caller, what="prompts")  # A's own upload, by URI
    assert mine.client.get_object(Bucket=mine.bucket, Key=mine.key)["Body"].read().count(b"A only") == 24
    anonymous = open_s3(f"s3://{OTHER_BUCKET}/x.jsonl", harness.settings, caller, what="prompts").client
    assert anonymous.meta.config.signature_version is UNSIGNED  # not the deployment's keys
    value = json.dumps({"access_key_id": "a-own-key", "secret_access_key": "a-own-secret-0123456789"})
    assert harness.client.put(f"/v1/secrets/s3.{OTHER_BUCKET}", json={"value": value},
                              headers=a.headers).status_code == 200
    signed = open_s3(f"s3://{OTHER_BUCKET}/x.jsonl", harness.settings, caller, what="prompts")
    assert signed.client._request_signer._credentials.access_key == "a-own-key"
    assert "a-own-secret-0123456789" in signed.scrub
    assert "amazonaws.com" in signed.client.meta.endpoint_url  # a secret without an endpoint is AWS, never ours
    # A fetched source read whole (data.count null) holds at most MAX_PROMPTS_PER_JOB prompts.
    monkeypatch.setattr(sources, "MAX_PROMPTS_PER_JOB", 10)
    with pytest.raises(SourceUnavailable, match="more than 10 prompts"):
        resolve_prompts(own, harness.settings, Path(ctx.cache) / "cap", caller=Caller(a.org_id, ctx.session_factory))
    assert resolve_prompts(own, harness.settings, Path(ctx.cache) / "cap", caller=caller, count=5).path


def test_a_secret_endpoint_into_our_storage_reaches_nothing_of_a_by_any_route(harness, ctx, organisation_a,
                                                                              monkeypatch):
    """Issue 32 item 1: B stores `s3.service` = {"endpoint_url": "http://<our storage host>/<our bucket>", ...} and
    names `s3://service/...`; botocore keeps the endpoint's path, so the request is `/<our bucket>/service/...`:
    A's objects. moto honours any access key, so whatever reaches our bucket reads and writes it with B's made-up
    keys: the worst case, where the scoping rule alone stands between B and A (a real store would also refuse
    B's keys on our bucket, but the rule may not lean on how a store's accounts are set up). The secret is
    refused at PUT /v1/secrets in every spelling of the host; one stored anyway (before the rule) is refused by
    the worker on every route: data source, target, warm start, publish destination, the audit's drafter and
    prompts; and the numeric alias `s3://127.1/<our bucket>/...` is refused at the API and in the worker."""
    import domain.secrets
    from worker.audits import execute_audit
    from worker.runner import Outcome, run_job
    from worker.sources import Caller, StorageNotAllowed, open_s3, resolve_prompts

    a, a_file, a_job = organisation_a
    b = harness.new_org()
    endpoint = harness.settings.s3_endpoint_url
    port = endpoint.rsplit(":", 1)[1]
    files, artifacts = f"s3://service/files/{a.org_id}/{a_file}.jsonl", f"s3://service/jobs/{a_job}/artifacts"
    # The route is live on this store: a plain client at that endpoint, with keys nobody issued, reads A's upload.
    raw = boto3.client("s3", endpoint_url=f"{endpoint}/{BUCKET}", region_name="us-east-1",
                       aws_access_key_id="b-key", aws_secret_access_key="b-made-up")
    assert b"A only" in raw.get_object(Bucket="service", Key=f"files/{a.org_id}/{a_file}.jsonl")["Body"].read()

    def value(host: str) -> str:
        return json.dumps({"access_key_id": "b-key", "secret_access_key": "b-secret-0123456789",
                           "endpoint_url": f"http://{host}:{port}/{BUCKET}"})

    for host in ("127.0.0.1", "localhost", "127.1", "2130706433", "0x7f000001", "0177.0.0.1", "[::ffff:127.0.0.1]",
                 "LOCALHOST.", "b.localhost"):
        refused = harness.client.put("/v1/secrets/s3.service", json={"value": value(host)}, headers=b.headers)
        assert refused.status_code == 422, (host, refused.text)
        error = refused.json()["errors"][0]
        assert error["field"] == "value.endpoint_url", error
        assert "publicly reachable" in error["message"] or "does not resolve" in error["message"], error
        assert "b-secret-0123456789" not in refused.text
    assert harness.client.get("/v1/secrets", headers=b.headers).json()["data"] == []

    with monkeypatch.context() as before_the_rule:  # stored as a deployment without the rule stored it
        before_the_rule.setattr(domain.secrets, "s3_secret_problems", lambda given, settings: [])
        assert harness.client.put("/v1/secrets/s3.service", json={"value": value("127.1")},
                                  headers=b.headers).status_code == 200
    alias = f"s3://127.1/{BUCKET}/service/files/{a.org_id}/{a_file}.jsonl"
    refused = harness.client.post("/v1/jobs", json={**MINIMAL, "data": {"source": alias}}, headers=b.headers)
    assert refused.status_code == 422 and refused.json()["errors"][0]["field"] == "data.source", refused.text

    before, copies_before = s3_objects(harness), a_copies(ctx)
    caller = Caller(b.org_id, ctx.session_factory)
    with pytest.raises(StorageNotAllowed, match="publicly reachable"):
        resolve_prompts(files, harness.settings, Path(ctx.cache) / "b", caller=caller)
    with pytest.raises(StorageNotAllowed, match="publicly reachable"):
        open_s3(artifacts, harness.settings, caller, what="publish[0]", write=True, explicit_secret="s3.service")
    jobs = [  # (spec sections, the stage that fails); the API admits all but the alias: it cannot see the endpoint
        ({"data": {"source": files}}, "prepare"),
        ({"target": {"uri": f"s3://service/jobs/{a_job}/work"}}, "prepare"),
        ({"init": {"from_drafter": artifacts}}, "prepare"),
        ({"data": {"source": alias}}, "prepare"),  # injected: the API refused it above
        ({"publish": [{"kind": "s3", "uri": artifacts, "credentials_secret": "s3.service"}]}, "publish"),
    ]
    b_jobs = set()
    for sections, failing_stage in jobs:
        job_id = harness.create_job(b)["id"]
        b_jobs.add(job_id)
        if failing_stage == "publish":
            for _ in range(5):  # prepare .. export: B's own artifacts, by the stage-runner API
                harness.runner.run_stage(job_id)
        inject(harness, job_id, **sections)
        assert run_job(ctx, job_id, lambda job, stage: None) is Outcome.FAILED
        status, code, message, stage = outcome(harness, job_id)
        assert (status, code, stage) == ("failed", "storage_not_allowed", failing_stage), (sections, message)
        assert "b-secret-0123456789" not in message
    import worker.audits
    from worker.sources import Resolved

    resolve_drafter = worker.audits.resolve_drafter
    # The prompts route needs a drafter that resolves first: B's own, stood in for (no Hub here).
    monkeypatch.setattr(worker.audits, "resolve_drafter", lambda reference, ctx, org_id: Resolved("b-own")
                        if reference == "hf://b/own-drafter" else resolve_drafter(reference, ctx, org_id))
    for spec in ({"drafter": artifacts, "target": {"uri": "bundled:smollm2-135m"}, "data": {"source": "builtin"}},
                 {"drafter": "hf://b/own-drafter", "target": {"uri": "bundled:smollm2-135m"}, "data": {"source": files}}):
        with harness.services.session_factory() as session:
            audit = Audit(id=new_id("aud_"), org_id=b.org_id, status="queued", drafter_ref=spec["drafter"],
                          target_uri="bundled:smollm2-135m", attempts=0, spec=spec)
            session.add(audit)
            session.commit()
            audit_id = audit.id
        assert execute_audit(ctx, audit_id) == "failed"
        with harness.services.session_factory() as session:
            row = session.get(Audit, audit_id)
            assert row.error_code == "storage_not_allowed", (spec, row.error_code, row.error_message)
    # Nothing of A's was written over or read into B's cache; our bucket gained only B's own jobs' artifacts.
    after = s3_objects(harness)
    assert {k: v for k, v in after.items() if k in before} == before
    assert all(k.split("/")[2] in b_jobs for k in set(after) - set(before)), sorted(set(after) - set(before))
    assert a_copies(ctx) == copies_before  # (A's own reads in the test above stay A's)


@pytest.fixture(scope="module")
def customer_server() -> Iterator[str]:
    """An organisation's own S3 server (its secrets name it as endpoint_url; our storage is never one)."""
    with moto_server() as endpoint:
        yield endpoint


def test_a_stop_request_ends_an_s3_target_download_mid_file(harness, ctx, customer_server):
    """A cancel during prepare is honoured at the next chunk of a large target's download, not after the whole
    file; a later fetch (the job resumed) completes it."""
    from trainer.errors import StageInterrupted
    from worker.sources import Caller, resolve_target

    weights = os.urandom(24 << 20)  # several multipart chunks
    customer = customer_server
    s3 = boto3.client("s3", endpoint_url=customer, region_name="us-east-1",
                      aws_access_key_id="testing", aws_secret_access_key="testing")
    s3.create_bucket(Bucket=OTHER_BUCKET)
    s3.put_object(Bucket=OTHER_BUCKET, Key="big/config.json", Body=b'{"model_type": "llama"}')
    s3.put_object(Bucket=OTHER_BUCKET, Key="big/model.safetensors", Body=weights)
    asked = []

    def stop_after_a_few_chunks() -> bool:
        asked.append(1)
        return len(asked) > 3

    org = harness.new_org()
    value = json.dumps({"access_key_id": "org-own-key", "secret_access_key": "org-own-secret-0123456789",
                        "endpoint_url": customer})
    assert harness.client.put(f"/v1/secrets/s3.{OTHER_BUCKET}", json={"value": value},
                              headers=org.headers).status_code == 200  # moto honours any key
    caller = Caller(org.org_id, ctx.session_factory)
    with pytest.raises(StageInterrupted, match="target: the download stopped on request"):
        resolve_target(f"s3://{OTHER_BUCKET}/big", harness.settings, Path(ctx.cache), caller=caller,
                       should_stop=stop_after_a_few_chunks)
    assert not any(p.name == "model.safetensors" and p.stat().st_size == len(weights)
                   for p in Path(ctx.cache, "targets").rglob("model.safetensors"))
    fetched = resolve_target(f"s3://{OTHER_BUCKET}/big", harness.settings, Path(ctx.cache), caller=caller)
    assert (Path(fetched.path) / "model.safetensors").read_bytes() == weights
