"""Artifact storage on S3, against a real `moto_server` process on a free loopback port: uploads land
in the bucket, downloads answer 307 to a presigned URL that serves the exact bytes."""

from __future__ import annotations

import os
from collections.abc import Iterator

import boto3
import httpx
import pytest
from api_harness import build_harness, make_settings
from services import moto_server

from domain.storage import LocalStorage, S3Storage, check_key, storage_from_settings

BUCKET = "draftsmith-artifacts"


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture
def s3_env(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                        ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    client = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    if BUCKET not in [b["Name"] for b in client.list_buckets()["Buckets"]]:
        client.create_bucket(Bucket=BUCKET)
    return moto_endpoint


def test_s3_storage_roundtrip(s3_env, tmp_path):
    settings = make_settings("sqlite://", tmp_path, storage_url=f"s3://{BUCKET}/prefix", s3_endpoint_url=s3_env)
    storage = storage_from_settings(settings)
    assert isinstance(storage, S3Storage)
    storage.ping()
    source = tmp_path / "blob.bin"
    source.write_bytes(os.urandom(100_000))
    stored = storage.put_file("jobs/j1/artifacts/blob.bin", source)
    assert stored.size_bytes == 100_000
    assert storage.exists("jobs/j1/artifacts/blob.bin") and not storage.exists("jobs/j1/artifacts/other")
    assert b"".join(storage.open_chunks("jobs/j1/artifacts/blob.bin")) == source.read_bytes()
    head = boto3.client("s3", endpoint_url=s3_env).head_object(Bucket=BUCKET, Key="prefix/jobs/j1/artifacts/blob.bin")
    assert head["Metadata"]["sha256"] == stored.sha256
    storage.delete("jobs/j1/artifacts/blob.bin")
    assert not storage.exists("jobs/j1/artifacts/blob.bin")


def test_artifact_download_redirects_to_presigned_url(s3_env, sqlite_url, tmp_path):
    settings = make_settings(sqlite_url, tmp_path, storage_url=f"s3://{BUCKET}/runs", s3_endpoint_url=s3_env)
    for harness in build_harness(settings):
        org = harness.new_org()
        job_id = harness.create_job(org)["id"]
        harness.runner.run_to_end(job_id)
        artifacts = harness.client.get(f"/v1/jobs/{job_id}/artifacts", headers=org.headers).json()["data"]
        model = next(a for a in artifacts if a["kind"] == "safetensors")
        response = harness.client.get(model["download_path"], headers=org.headers, follow_redirects=False)
        assert response.status_code == 307
        location = response.headers["location"]
        assert location.startswith(f"{s3_env}/{BUCKET}/runs/jobs/{job_id}/artifacts/drafter/model.safetensors?")
        assert "X-Amz-Signature=" in location and "X-Amz-Expires=900" in location
        fetched = httpx.get(location)
        assert fetched.status_code == 200
        assert fetched.content == harness.runner.artifact_bytes[f"{job_id}/drafter/model.safetensors"]
        assert 'filename="model.safetensors"' in fetched.headers["content-disposition"]
        # Another organisation cannot even obtain the URL.
        other = harness.new_org()
        assert harness.client.get(model["download_path"], headers=other.headers,
                                  follow_redirects=False).status_code == 404


def test_storage_keys_cannot_escape(tmp_path):
    for bad in ("", "/abs", "a/../b", "a//b", "./a", "a/./b", "a\\b", "a b"):
        with pytest.raises(ValueError):
            check_key(bad)
    storage = LocalStorage(tmp_path / "root")
    with pytest.raises(ValueError):
        storage.put_bytes("../outside", b"x")
    assert not (tmp_path / "outside").exists()
    stored = storage.put_bytes("ok/file.txt", b"hello")
    assert (tmp_path / "root" / "ok" / "file.txt").read_bytes() == b"hello" and stored.size_bytes == 5
    assert not list((tmp_path / "root" / "ok").glob(".partial-*"))  # no temp file left behind
