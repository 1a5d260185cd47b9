"""Driving the real service from tests: a `Service` (API URL, its environment, workers started on demand,
the Redis, S3 and Hub stand-in it talks to) and the tiny job spec that runs every stage in seconds."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import boto3
import httpx
from hub_standin import HubStandIn
from services import DraftsmithProcess, RedisServer, wait_until

API_KEY = "dsk_dev_worker_tests_key"
HUB_TOKEN = "hf_standin_token_for_tests"
STORAGE_BUCKET = "draftsmith-storage"
TERMINAL = {"succeeded", "failed", "cancelled"}


def tiny_spec(target_uri: str, **sections) -> dict:
    """A job that runs every stage in seconds: DFlash v1 (no 25M-parameter selector), few prompts and steps."""
    spec = {
        "target": {"uri": target_uri},
        "sampling": {"max_new_tokens": 8},
        "drafter": {"variant": "dflash", "num_layers": 1, "block_size": 4},
        "data": {"count": 30, "holdout_share": 0.2},
        "training": {"max_steps": 6, "batch_size": 4, "anchors_per_sequence": 4},
        "validation": {"prompts": 2, "max_new_tokens": 8, "sampling_draws": 20},
    }
    for name, values in sections.items():
        spec[name] = {**spec.get(name, {}), **values}
    return spec


@dataclass
class Service:
    env: dict[str, str]
    url: str
    root: Path
    redis: RedisServer
    hub: HubStandIn
    s3_endpoint: str
    customer_s3_endpoint: str
    """A customer's own S3 server: where an organisation's secret points (the deployment's is never allowed)."""
    models: Path
    workers: list[DraftsmithProcess] = field(default_factory=list)

    @property
    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30)

    def start_worker(self, queues: str = "gpu,cpu", *, name: str, **settings: str) -> DraftsmithProcess:
        env = {**self.env, "DRAFTSMITH_WORKER_CACHE_DIR": str(self.root / f"cache-{name}"), **settings}
        worker = DraftsmithProcess(["worker", "--queues", queues], env, self.root / f"worker-{name}.log")
        self.workers.append(worker)
        return worker

    def submit(self, spec: dict) -> str:
        with self.http as http:
            response = http.post("/v1/jobs", json=spec)
        assert response.status_code == 201, response.text
        return response.json()["id"]

    def job(self, job_id: str) -> dict:
        with self.http as http:
            return http.get(f"/v1/jobs/{job_id}").json()

    def events(self, job_id: str) -> list[dict]:
        events, after = [], 0
        with self.http as http:
            while True:
                page = http.get(f"/v1/jobs/{job_id}/events", params={"after": after, "limit": 1000}).json()
                events += page["data"]
                if not page["has_more"]:
                    return events
                after = page["next_cursor"]

    def wait_for(self, job_id: str, condition, timeout: float, what: str) -> dict:
        def check():
            job = self.job(job_id)
            for worker in self.workers:
                if worker.process.returncode not in (None, -9, -15, 0) and not worker.alive():
                    raise AssertionError(f"a worker died:\n{worker.log()[-3000:]}")
            return job if condition(job) else None

        try:
            return wait_until(check, timeout, what, interval=0.5)
        except TimeoutError:
            logs = "\n".join(w.log()[-2500:] for w in self.workers)
            raise AssertionError(f"{what}: job is {json.dumps(self.job(job_id))[:1500]}\n{logs}") from None

    def wait_terminal(self, job_id: str, timeout: float = 300) -> dict:
        return self.wait_for(job_id, lambda job: job["status"] in TERMINAL, timeout, f"job {job_id} to end")

    def training_step(self, job_id: str) -> int:
        with self.http as http:
            series = http.get(f"/v1/jobs/{job_id}/metrics", params={"name": "loss", "max_points": 10000}).json()
        points = series["series"][0]["points"] if series["series"] else []
        return max((p["step"] for p in points), default=0)

    def s3(self, endpoint: str | None = None):
        return boto3.client("s3", endpoint_url=endpoint or self.s3_endpoint, region_name="us-east-1",
                            aws_access_key_id="testing", aws_secret_access_key="testing")


