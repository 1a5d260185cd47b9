"""A redirect from an S3 endpoint an organisation names (its secret's `endpoint_url`) is refused on the first hop,
as a storage error that names the endpoint, the secret's field and the fix. botocore, left to itself, answers a
307 from a custom endpoint by asking the bucket's region with a HEAD that is redirected too, and recurses until
RecursionError.

The endpoint is a real HTTP server on loopback (a network the test deployment allow-lists, tests/api/api_harness.py)
that answers every request with a redirect and counts them; botocore is not mocked. The job runs in this process
(`run_job`) on PostgreSQL with local storage."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from api_harness import Harness, build_harness, make_settings
from services import fresh_postgres_database
from sqlalchemy import select

from domain.models import Job
from domain.queue import all_queues
from domain.storage import StorageRedirected, organisation_s3_client

BUCKET = "redirecting-bucket"


class RedirectingS3:
    """Answers every request with `status` to another host, and records each request's method and path."""

    def __init__(self, status: int) -> None:
        seen: list[str] = []
        self.seen = seen

        class Handler(BaseHTTPRequestHandler):
            def _redirect(self) -> None:
                seen.append(f"{self.command} {self.path}")
                self.send_response(status)
                self.send_header("Location", f"http://elsewhere.example{self.path}")
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_HEAD = do_PUT = do_POST = _redirect

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> RedirectingS3:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> Iterator[Harness]:
    from migrations.revisions import upgrade

    url, drop = fresh_postgres_database("draftsmith_s3_redirects")
    upgrade(url)
    try:
        settings = make_settings(url, tmp_path_factory.mktemp("storage"),
                                 worker_cache_dir=str(tmp_path_factory.mktemp("worker-cache")))
        yield from build_harness(settings)
    finally:
        drop()


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_each_call_stops_at_the_first_redirect(harness, status):
    with RedirectingS3(status) as endpoint:
        client = organisation_s3_client(harness.settings, access_key_id="org-key", secret_access_key="org-secret",
                                        endpoint_url=endpoint.endpoint, region=None,
                                        endpoint_setting="the endpoint_url of your secret 's3'")
        calls = [lambda: client.get_object(Bucket=BUCKET, Key="prompts.jsonl"),
                 lambda: client.head_object(Bucket=BUCKET, Key="prompts.jsonl"),
                 lambda: client.list_objects_v2(Bucket=BUCKET, Prefix="model/"),
                 lambda: client.put_object(Bucket=BUCKET, Key="published/x", Body=b"x")]
        for number, call in enumerate(calls, start=1):
            with pytest.raises(StorageRedirected) as refused:
                call()
            assert len(endpoint.seen) == number, endpoint.seen  # one request each: no retry, no HEAD for a region
            message = str(refused.value)
            assert f"object storage at {endpoint.endpoint} answered" in message
            assert f"with a redirect ({status} to http://elsewhere.example/" in message
            assert "set the endpoint_url of your secret 's3' to the address that serves the bucket itself" in message


def test_a_job_whose_secret_endpoint_redirects_fails_with_a_storage_error_naming_the_secret(harness):
    from worker.context import WorkerContext
    from worker.runner import Outcome, run_job

    org = harness.new_org()
    secret = f"s3.{BUCKET}"
    with RedirectingS3(307) as endpoint:
        value = json.dumps({"access_key_id": "org-key", "secret_access_key": "org-secret-0123456789",
                            "endpoint_url": endpoint.endpoint})
        assert harness.client.put(f"/v1/secrets/{secret}", json={"value": value},
                                  headers=org.headers).status_code == 200
        job_id = harness.create_job(org, {"target": {"uri": f"s3://{BUCKET}/model"}})["id"]
        ctx = WorkerContext(harness.settings, frozenset(all_queues(harness.settings)))

        assert run_job(ctx, job_id, lambda job, stage: None) is Outcome.FAILED

        assert len(endpoint.seen) == 1, endpoint.seen  # the first hop, and nothing after it
    with harness.services.session_factory() as session:
        job = session.scalar(select(Job).where(Job.id == job_id))
        assert (job.status, job.error_code, job.error_stage) == ("failed", "storage_error", "prepare")
        assert f"object storage at {endpoint.endpoint} answered ListObjectsV2 with a redirect (307" in job.error_message
        assert (f"set the endpoint_url of your secret '{secret}' (PUT /v1/secrets/{secret}) to the address that "
                "serves the bucket itself") in job.error_message
        assert "org-secret-0123456789" not in job.error_message
    assert not list(Path(harness.settings.worker_cache_dir).rglob("model/*"))
