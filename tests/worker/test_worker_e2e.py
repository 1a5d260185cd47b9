"""A job submitted over HTTP runs on real Celery workers, end to end: PostgreSQL, Redis, S3 (moto_server)
and the Hub (a local stand-in, since the real one cannot be reached from here)."""

from __future__ import annotations

import hashlib
import json

import httpx
import pytest
from worker_harness import API_KEY, HUB_TOKEN, tiny_spec

pytestmark = pytest.mark.slow

STAGES = ["prepare", "generate", "train", "validate", "export", "publish"]


def test_rest_job_runs_on_gpu_and_cpu_workers_to_published_verified_artifacts(workers, models):
    service = workers
    # The target comes from the Hub (pinned to a commit); the drafter goes to S3 and back to the Hub.
    target_files = {p.name: p.read_bytes() for p in (models / "bpe").iterdir() if p.is_file()}
    target_commit = service.hub.put_files("acme/tiny-target", target_files)
    with service.http as http:
        assert http.put("/v1/secrets/published-bucket", json={"value": json.dumps(
            {"access_key_id": "testing", "secret_access_key": "testing", "endpoint_url": service.customer_s3_endpoint})}
        ).status_code == 200
    prompts = "".join(json.dumps({"prompt": f"Tell me fact number {i} about {topic}.", "category": topic}) + "\n"
                      for i in range(15) for topic in ("rivers", "stars"))
    with service.http as http:
        upload = http.post("/v1/files", files={"file": ("prompts.jsonl", prompts.encode())}, data={"purpose": "prompts"})
    assert upload.status_code == 201, upload.text
    spec = tiny_spec("hf://acme/tiny-target", data={"source": upload.json()["id"]})
    spec["publish"] = [{"kind": "s3", "uri": "s3://published/drafters/tiny", "credentials_secret": "published-bucket"},
                       {"kind": "hf", "repo": "acme/tiny-drafter", "private": True}]
    service.start_worker("gpu", name="gpu")
    service.start_worker("cpu", name="cpu")

    job_id = service.submit(spec)
    job = service.wait_terminal(job_id, timeout=420)
    assert job["status"] == "succeeded", job["error"]
    assert [s["stage"] for s in job["stages"]] == STAGES and {s["status"] for s in job["stages"]} == {"succeeded"}
    assert job["run_attempts"] == 2  # picked up by the gpu worker, then handed to the cpu worker

    events = service.events(job_id)
    assert [e["id"] for e in events] == list(range(1, len(events) + 1))  # in order, none missing
    statuses = [e["data"]["to"] for e in events if e["type"] == "job.status_changed"]
    assert statuses == ["preparing", "generating", "training", "validating", "exporting", "publishing", "succeeded"]
    assert [e["stage"] for e in events if e["type"] == "stage.started"] == STAGES
    assert any("handed to queue" in e["message"] and e["stage"] == "export" for e in events)
    pinned = next(e for e in events if "pinned at revision" in e["message"])
    assert pinned["data"]["target_revision"] == target_commit
    assert any(e["type"] == "stage.progress" and e["stage"] == "train" and 0 < e["progress"] < 100 for e in events)
    with service.http as http:
        metrics = http.get(f"/v1/jobs/{job_id}/metrics", params={"name": ["loss", "accuracy_pos_1"]}).json()
    assert {s["name"]: [p["step"] for p in s["points"]] for s in metrics["series"]} == {
        "loss": [1, 2, 3, 4, 5, 6], "accuracy_pos_1": [1, 2, 3, 4, 5, 6]}

    # Every artifact downloads (307 to a presigned S3 URL) with the sha256 the API and the manifest give.
    with service.http as http:
        artifacts = {a["name"]: a for a in http.get(f"/v1/jobs/{job_id}/artifacts").json()["data"]}
        manifest = json.loads(http.get(artifacts["manifest.json"]["download_path"], follow_redirects=True).content)
        assert set(artifacts) == set(manifest["files"]) | {"manifest.json"}
        for name, entry in manifest["files"].items():
            response = http.get(artifacts[name]["download_path"])
            assert response.status_code == 307
            body = httpx.get(response.headers["location"]).content  # presigned: no API key needed
            assert hashlib.sha256(body).hexdigest() == entry["sha256"] == artifacts[name]["sha256"], name
    assert {"drafter/model.safetensors", "gguf/drafter-f16.gguf", "report.json", "README.md"} <= set(manifest["files"])
    with service.http as http:  # validated on the uploaded prompts' own categories
        report = json.loads(http.get(artifacts["report.json"]["download_path"], follow_redirects=True).content)
    assert set(report["acceptance_by_category"]) <= {"rivers", "stars"}

    # Published to S3 with the job's metadata, verified, and to the Hub in one commit recorded on the job.
    s3 = service.s3(service.customer_s3_endpoint)
    for name, entry in manifest["files"].items():
        head = s3.head_object(Bucket="published", Key=f"drafters/tiny/{name}", ChecksumMode="ENABLED")
        assert head["Metadata"]["draftsmith-job-id"] == job_id and head["Metadata"]["sha256"] == entry["sha256"]
        assert head["Metadata"]["target-fingerprint"].startswith("sha256:")
    publications = {p["kind"]: p for p in job["publications"]}
    assert publications["s3"]["location"] == "s3://published/drafters/tiny"
    repo = service.hub.repos["model/acme/tiny-drafter"]
    assert repo.private and len(repo.commits) == 1
    commit_sha, files = repo.commits[0]
    assert publications["hf"]["revision"] == commit_sha
    assert hashlib.sha256(files["drafter/model.safetensors"]).hexdigest() == \
        manifest["files"]["drafter/model.safetensors"]["sha256"]
    assert "README.md" in files
    # Credentials went where they belong, and nowhere else.
    assert all(auth == f"Bearer {HUB_TOKEN}" for _, _, auth in service.hub.calls)
    everything = json.dumps(job) + json.dumps(events) + "".join(w.log() for w in service.workers)
    assert HUB_TOKEN not in everything and API_KEY not in everything
