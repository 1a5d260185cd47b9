"""One job's regeneration spread over three worker processes (real Redis, PostgreSQL and S3), one of them
SIGKILLed while it holds a shard: the job finishes with the very data one worker writes alone."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from services import wait_until
from sqlalchemy import create_engine, text
from worker_harness import STORAGE_BUCKET, tiny_spec

pytestmark = pytest.mark.slow

# About 90 training prompts in shards of 8; 128 new tokens each keep a shard busy for a second or more here.
SPEC = dict(data={"count": 120, "holdout_share": 0.2, "shard_size": 8}, sampling={"max_new_tokens": 128})
# One thread per worker: three workers share two cores, and equal data need equal arithmetic (a matmul's
# reduction order follows its thread count).
THREADS = {"OMP_NUM_THREADS": "1"}


def _data_files(service, job_id: str) -> dict[str, bytes]:
    s3, prefix = service.s3(), f"service/jobs/{job_id}/work/data/"
    keys = [item["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=STORAGE_BUCKET, Prefix=prefix)
            for item in page.get("Contents", [])]
    return {key[len(prefix):]: s3.get_object(Bucket=STORAGE_BUCKET, Key=key)["Body"].read() for key in keys}


def _decoded(files: dict[str, bytes]) -> dict[str, object]:
    """The data set's content: meta.json, every parquet table and every tensor, independent of file encoding."""
    import pyarrow.parquet as pq
    from safetensors.torch import load

    out: dict[str, object] = {}
    for name, blob in sorted(files.items()):
        if name.endswith(".parquet"):
            out[name] = pq.read_table(io.BytesIO(blob)).to_pydict()
        elif name.endswith(".safetensors"):
            out[name] = {key: tensor.float().tolist() for key, tensor in sorted(load(blob).items())}
        elif name == "meta.json":
            out[name] = json.loads(blob)
        else:
            out[name] = blob
    return out


def _parent_pid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def test_three_workers_share_one_jobs_generation_and_survive_a_sigkill(workers, models):
    service = workers
    spec = tiny_spec(f"file://{models}/bpe", **SPEC)

    solo = service.start_worker(name="solo", **THREADS)  # the reference: one worker writes every shard
    reference = service.submit(spec)
    assert service.wait_terminal(reference)["status"] == "succeeded"
    solo.stop()

    spread = {"DRAFTSMITH_WORKER_GENERATE_WORKERS": "3", **THREADS}
    started = {name: service.start_worker(name=name, **spread) for name in ("a", "b", "c")}
    # All three consuming before the job arrives, so that helpers exist while its shards are generated.
    wait_until(lambda: all(" ready." in w.log() for w in started.values()), 120, "the workers to start")
    job_id = service.submit(spec)
    database = create_engine(service.env["DRAFTSMITH_DATABASE_URL"])

    def running_helper_shard():
        """(shard, worker process) of a shard held by a worker that is not the stage's lead."""
        with database.connect() as connection:
            lead = connection.execute(text("select worker_id from stage_runs where job_id = :j and stage = "
                                           "'generate' and status = 'running'"), {"j": job_id}).scalar()
            rows = connection.execute(text("select shard, worker_id from generate_shards where job_id = :j and "
                                           "status = 'running'"), {"j": job_id}).all()
        for shard, worker_id in rows:
            if worker_id == lead:
                continue
            parent = _parent_pid(int(worker_id.rsplit(":", 1)[1]))
            for process in started.values():
                if process.process.pid == parent:
                    return shard, worker_id, process
        return None

    shard, doomed_id, doomed = wait_until(running_helper_shard, 240, "a helper to hold a shard", interval=0.05)
    doomed.kill()  # SIGKILL mid-shard: no release, no acknowledgement; its claim just stops beating
    job = service.wait_terminal(job_id, timeout=400)
    assert job["status"] == "succeeded", job["error"]

    # The data equal the one-worker run's, file for file (the shard's seed is its index, whoever writes it).
    assert _decoded(_data_files(service, job_id)) == _decoded(_data_files(service, reference))

    with database.connect() as connection:
        rows = connection.execute(text("select shard, status, attempt, worker_id, finished_at from generate_shards "
                                       "where job_id = :j order by shard"), {"j": job_id}).all()
        train_started = connection.execute(text("select min(started_at) from stage_runs where job_id = :j and "
                                                "stage = 'train'"), {"j": job_id}).scalar()
    database.dispose()
    count = len(rows)  # the training prompts (the hold-out is drawn per category) in shards of 8
    assert count >= 8 and [r.shard for r in rows] == list(range(count)) and {r.status for r in rows} == {"done"}
    assert doomed_id not in {r.worker_id for r in rows if r.shard == shard}  # written again by another worker
    taken_over = [r for r in rows if r.attempt >= 2]
    assert taken_over and all(r.worker_id != doomed_id for r in taken_over)
    assert train_started > max(r.finished_at for r in rows)  # training began once every shard was whole

    events = service.events(job_id)
    assert any(e["message"].startswith(f"generate: {count} shards of up to 8 prompts over up to 3 workers")
               for e in events)
    assert any(f"{doomed_id} went quiet" in e["message"] for e in events)
    written = [e["data"] for e in events if e["message"].startswith("shard ") and "generated by" in e["message"]]
    assert {d["shard"] for d in written} == set(range(count)) and all(d["tokens_per_s"] > 0 for d in written)
    throughput = next(e for e in events if e["message"].startswith("generate: ") and "workers wrote" in e["message"])
    per_worker = throughput["data"]["workers"]
    print(throughput["message"])  # per-worker throughput (pytest -s)
    assert len(per_worker) >= 2 and sum(w["shards"] for w in per_worker.values()) == count
    assert all(w["tokens_per_s"] > 0 for w in per_worker.values())
    progress = [e["progress"] for e in events if e["stage"] == "generate" and e["progress"] is not None]
    assert progress == sorted(progress) and progress[-1] == 100.0  # summed over shards, never backwards
