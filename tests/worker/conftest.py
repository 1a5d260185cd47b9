"""The service for real: a fresh PostgreSQL database, a private redis-server (restartable), S3 through a
moto_server, the Hub through a local stand-in (the real Hub cannot be reached from here), `draftsmith api`
and `draftsmith worker` processes. Jobs train a tiny random Llama with SmolLM2's real tokenizer, so every
stage (GGUF export included) runs in seconds."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from hub_standin import HubStandIn
from services import RedisServer, fresh_postgres_database, inherited_env, moto_server, start_api
from tiny_targets import make_bpe_target
from worker_harness import API_KEY, HUB_TOKEN, STORAGE_BUCKET, Service


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> Path:
    """The allowed root for file:// targets, holding the tiny BPE target."""
    root = tmp_path_factory.mktemp("models")
    make_bpe_target(root / "bpe", num_layers=4)
    return root


@pytest.fixture(scope="session")
def service(tmp_path_factory, models) -> Iterator[Service]:
    from migrations.revisions import upgrade

    root = tmp_path_factory.mktemp("service")
    database_url, drop_database = fresh_postgres_database("draftsmith_worker_test")
    redis = RedisServer(root)
    redis.start()
    # A customer's own S3 server beside the deployment's: an organisation's secret names it (never ours).
    with moto_server() as s3_endpoint, moto_server() as customer_s3, HubStandIn(HUB_TOKEN) as hub:
        for endpoint in (s3_endpoint, customer_s3):
            s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                              aws_access_key_id="testing", aws_secret_access_key="testing")
            for bucket in (STORAGE_BUCKET, "published"):
                s3.create_bucket(Bucket=bucket)
        env = {
            **inherited_env("DRAFTSMITH_", "AWS_"),
            "DRAFTSMITH_ENV": "development", "DRAFTSMITH_DEV_API_KEY": API_KEY,
            "DRAFTSMITH_DATABASE_URL": database_url, "DRAFTSMITH_BROKER_URL": redis.url,
            "DRAFTSMITH_QUEUE_NAME": f"draftsmith-test-{int(time.time())}",
            "DRAFTSMITH_STORAGE_URL": f"s3://{STORAGE_BUCKET}/service",
            "DRAFTSMITH_S3_ENDPOINT_URL": s3_endpoint, "DRAFTSMITH_S3_ACCESS_KEY_ID": "testing",
            "DRAFTSMITH_S3_SECRET_ACCESS_KEY": "testing",
            "DRAFTSMITH_ALLOWED_FILE_ROOTS": str(models),
            "DRAFTSMITH_HF_ENDPOINT": hub.url, "DRAFTSMITH_HF_TOKEN": HUB_TOKEN,
            "DRAFTSMITH_WORKER_HEARTBEAT_SECONDS": "1", "DRAFTSMITH_WORKER_STALE_AFTER_SECONDS": "6",
            "DRAFTSMITH_WEBHOOK_DISPATCH_INTERVAL_SECONDS": "0",
            "HF_HUB_DISABLE_TELEMETRY": "1", "TOKENIZERS_PARALLELISM": "false",
        }
        upgrade(database_url)
        api, url = start_api(env, root / "api.log")
        service = Service(env, url, root, redis, hub, s3_endpoint, customer_s3, models)
        try:
            yield service
        finally:
            for worker in service.workers:
                worker.stop(timeout=10)
            api.stop()
            redis.stop()
            drop_database()


@pytest.fixture
def workers(service: Service) -> Iterator[Service]:
    """The service, with every worker a test starts stopped at its end, and any job the test left unfinished
    (it failed or timed out) ended, so that it does not hold the organisation's active-job slots for the
    tests after it."""
    yield service
    for worker in service.workers:
        worker.stop(timeout=15)
    service.workers.clear()
    _end_unfinished_jobs(service.env["DRAFTSMITH_DATABASE_URL"])


def _end_unfinished_jobs(database_url: str) -> None:
    from sqlalchemy import update

    from domain.db import create_db_engine
    from domain.models import Job
    from domain.states import ACTIVE_STATUSES, JobStatus

    engine = create_db_engine(database_url, null_pool=True)
    try:
        with engine.begin() as connection:
            connection.execute(update(Job).where(Job.status.in_(list(ACTIVE_STATUSES)))
                               .values(status=JobStatus.FAILED.value))
    finally:
        engine.dispose()
