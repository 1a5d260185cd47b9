"""Job creation rules through HTTP, on SQLite and PostgreSQL: idempotency, pagination and filters,
tenant isolation, validation errors that name fields, and the per-organisation concurrency limit."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from schemas import recipe

MINIMAL = {"target": {"uri": "bundled:smollm2-135m"}}


def test_idempotent_create(harness):
    org = harness.new_org()
    key = {"Idempotency-Key": "create-0001"}
    first = harness.client.post("/v1/jobs", json=MINIMAL, headers={**org.headers, **key})
    assert first.status_code == 201 and "Idempotent-Replayed" not in first.headers
    # Same key, same meaning (explicit defaults, different key order): the same job, 200.
    same = {"drafter": {"block_size": 8}, "target": {"uri": "bundled:smollm2-135m"}}
    replay = harness.client.post("/v1/jobs", json=same, headers={**org.headers, **key})
    assert replay.status_code == 200 and replay.headers["Idempotent-Replayed"] == "true"
    assert replay.json()["id"] == first.json()["id"]
    assert harness.services.queue.job_ids().count(first.json()["id"]) == 1  # not enqueued twice

    before = harness.row_counts()
    different = harness.client.post("/v1/jobs", json={**MINIMAL, "drafter": {"block_size": 16}},
                                    headers={**org.headers, **key})
    assert different.status_code == 409
    assert different.json()["type"].endswith("idempotency-key-reused")
    assert different.json()["job_id"] == first.json()["id"]
    assert harness.row_counts() == before

    # Keys are per organisation: another org may use the same key for its own job.
    other = harness.new_org()
    theirs = harness.client.post("/v1/jobs", json=MINIMAL, headers={**other.headers, **key})
    assert theirs.status_code == 201 and theirs.json()["id"] != first.json()["id"]

    bad_key = harness.client.post("/v1/jobs", json=MINIMAL, headers={**org.headers, "Idempotency-Key": "has space"})
    assert bad_key.status_code == 422 and bad_key.json()["errors"][0]["field"] == "Idempotency-Key"


def test_concurrent_idempotent_creates_make_one_job(harness):
    org = harness.new_org()
    headers = {**org.headers, "Idempotency-Key": "race-1"}

    def post(_: int) -> tuple[int, str]:
        response = harness.client.post("/v1/jobs", json=MINIMAL, headers=headers)
        return response.status_code, response.json()["id"]

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(post, range(4)))
    assert sorted(code for code, _ in results) == [200, 200, 200, 201]
    assert len({job_id for _, job_id in results}) == 1


def test_pagination_and_filters(harness):
    org = harness.new_org()
    created = [harness.create_job(org, {**MINIMAL, "labels": {"batch": "a" if i % 2 else "b", "n": str(i)}})["id"]
               for i in range(5)]
    seen, cursor = [], None
    while True:
        url = "/v1/jobs?limit=2" + (f"&after={cursor}" if cursor else "")
        page = harness.client.get(url, headers=org.headers).json()
        assert len(page["data"]) <= 2
        seen += [job["id"] for job in page["data"]]
        cursor = page["next_cursor"]
        assert page["has_more"] == (cursor is not None)
        if cursor is None:
            break
    assert seen == list(reversed(created))  # newest first, each exactly once

    labelled = harness.client.get("/v1/jobs?label=batch:a", headers=org.headers).json()["data"]
    assert {job["id"] for job in labelled} == {created[1], created[3]}
    both = harness.client.get("/v1/jobs?label=batch:a&label=n:3", headers=org.headers).json()["data"]
    assert [job["id"] for job in both] == [created[3]]

    harness.client.post(f"/v1/jobs/{created[0]}/cancel", headers=org.headers)
    cancelled = harness.client.get("/v1/jobs?status=cancelled", headers=org.headers).json()["data"]
    assert [job["id"] for job in cancelled] == [created[0]]
    queued_or_cancelled = harness.client.get("/v1/jobs?status=queued&status=cancelled", headers=org.headers).json()
    assert len(queued_or_cancelled["data"]) == 5

    for bad, field in (("status=bogus", "status"), ("label=nocolon", "label"), ("after=xyz", "after"),
                       ("limit=0", "limit"), ("limit=101", "limit")):
        response = harness.client.get(f"/v1/jobs?{bad}", headers=org.headers)
        assert response.status_code == 422, bad
        assert response.json()["errors"][0]["field"].split(".")[0] == field


def test_other_organisations_get_404(harness):
    org_a, org_b = harness.new_org(), harness.new_org()
    job_id = harness.create_job(org_a)["id"]
    harness.runner.run_to_end(job_id)
    artifact = harness.client.get(f"/v1/jobs/{job_id}/artifacts", headers=org_a.headers).json()["data"][0]
    assert harness.client.get(artifact["download_path"], headers=org_a.headers).status_code == 200

    before = harness.row_counts()
    for method, path in (
        ("GET", f"/v1/jobs/{job_id}"),
        ("GET", f"/v1/jobs/{job_id}/events"),
        ("GET", f"/v1/jobs/{job_id}/metrics"),
        ("GET", f"/v1/jobs/{job_id}/artifacts"),
        ("GET", artifact["download_path"]),
        ("POST", f"/v1/jobs/{job_id}/cancel"),
        ("POST", f"/v1/jobs/{job_id}/resume"),
    ):
        response = harness.client.request(method, path, headers=org_b.headers)
        assert response.status_code == 404, (method, path, response.text)
        assert response.headers["content-type"] == "application/problem+json"
        assert job_id in response.json()["detail"] or "no job" in response.json()["detail"]
    assert harness.client.get("/v1/jobs", headers=org_b.headers).json()["data"] == []
    assert harness.row_counts() == before


@pytest.mark.parametrize(
    ("body", "field", "fragment"),
    [
        ({}, "target", "required: set target.uri (where the target lives"),
        ({"target": {"uri": "bundled:gpt-17"}}, "target.uri", "unknown bundled target"),
        ({**MINIMAL, "drafter": {"block_size": 64}}, "drafter.block_size", "less than or equal to 32"),
        ({**MINIMAL, "drafter": {"num_layers": 0}}, "drafter.num_layers", "greater than or equal to 1"),
        ({**MINIMAL, "drafter": {"variant": "eagle3"}}, "drafter.variant", "'dflash2' or 'dflash'"),
        ({**MINIMAL, "drafter": {"target_layer_ids": [5, 2]}}, "drafter.target_layer_ids", "strictly increasing"),
        ({**MINIMAL, "data": {"holdout_share": 0.7}}, "data.holdout_share", "0.5"),
        ({**MINIMAL, "data": {"count": 5}}, "data", "holds out no prompt"),
        ({**MINIMAL, "data": {"source": "file-nope"}}, "data.source", "not a file id"),
        ({**MINIMAL, "sampling": {"temperature": 3}}, "sampling.temperature", "less than or equal to 2"),
        ({**MINIMAL, "training": {"zero_stage": 1}}, "training.zero_stage", "2 or 3"),
        ({**MINIMAL, "publish": [{"kind": "s3", "uri": "https://x"}]}, "publish.0.s3.uri", "s3://"),
        ({**MINIMAL, "publish": [{"kind": "ftp"}]}, "publish.0", "tag"),
        ({**MINIMAL, "labels": {"Bad Key": "x"}}, "labels", "label key"),
        ({**MINIMAL, "drafter": {"blocksize": 8}}, "drafter.blocksize", "Extra inputs"),
        ({"target": {"uri": "bundled:smollm2-135m", "trust_remote_code": True}}, "target.trust_remote_code",
         "DRAFTSMITH_ALLOW_TRUST_REMOTE_CODE"),
    ],
)
def test_invalid_specs_name_the_field(harness, body, field, fragment):
    org = harness.new_org()
    before = harness.row_counts()
    response = harness.client.post("/v1/jobs", json=body, headers=org.headers)
    assert response.status_code == 422, response.text
    problem = response.json()
    assert response.headers["content-type"] == "application/problem+json"
    assert set(problem) >= {"type", "title", "status", "detail", "instance", "errors"}
    assert problem["instance"] == "/v1/jobs"
    fields = [e["field"] for e in problem["errors"]]
    assert field in fields, fields
    assert fragment in " ".join(e["message"] for e in problem["errors"]), problem
    assert harness.row_counts() == before


def test_unknown_uploaded_file_is_rejected(harness):
    org, other = harness.new_org(), harness.new_org()
    upload = harness.client.post("/v1/files", headers=other.headers,
                                 files={"file": ("p.jsonl", b'{"prompt": "hi"}\n', "application/jsonl")})
    assert upload.status_code == 201
    # Org A cannot reference org B's file.
    response = harness.client.post("/v1/jobs", headers=org.headers,
                                   json={**MINIMAL, "data": {"source": upload.json()["id"]}})
    assert response.status_code == 422 and response.json()["errors"][0]["field"] == "data.source"
    mine = harness.client.post("/v1/jobs", headers=other.headers, json={**MINIMAL, "data": {"source": upload.json()["id"]}})
    assert mine.status_code == 201


def test_concurrency_limit_per_organisation(harness):
    org = harness.new_org(limit=2)
    first = harness.create_job(org)
    harness.create_job(org)
    before = harness.row_counts()
    third = harness.client.post("/v1/jobs", json=MINIMAL, headers=org.headers)
    assert third.status_code == 429
    problem = third.json()
    assert problem["type"].endswith("concurrency-limit") and problem["limit"] == 2 and problem["active_jobs"] == 2
    assert "cancel" in problem["detail"] and third.headers["Retry-After"]
    assert harness.row_counts() == before
    # Another organisation is unaffected; finishing a job frees a slot.
    harness.create_job(harness.new_org())
    harness.client.post(f"/v1/jobs/{first['id']}/cancel", headers=org.headers)
    assert harness.client.post("/v1/jobs", json=MINIMAL, headers=org.headers).status_code == 201


def test_estimate(harness):
    org = harness.new_org(scopes=("read",))
    body = {"target": {"uri": "hf://acme/support-llama-8b@v3"}, "data": {"source": "hf://acme/prompts", "count": 1000},
            "sampling": {"max_new_tokens": 512}, "training": {"max_steps": 100, "max_minutes": 1}}
    response = harness.client.post("/v1/jobs/estimate?gpu_class=h100-80gb", json=body, headers=org.headers)
    assert response.status_code == 200, response.text
    estimate = response.json()
    assert estimate["tokens_to_generate"] == 1000 * 512
    assert estimate["holdout_prompts"] == int(1000 * recipe.HOLDOUT_SHARE)  # the default share
    assert estimate["target_parameters_billion"] == 8.0 and "model name" in estimate["assumptions"][0]
    (h100,) = estimate["estimates"]
    assert h100["gpu_class"] == "h100-80gb" and h100["cost_usd"] > 0
    assert h100["total_minutes"] == pytest.approx(h100["generation_minutes"] + h100["training_minutes"]
                                                  + h100["validation_minutes"] + h100["overhead_minutes"], abs=0.05)
    everything = harness.client.post("/v1/jobs/estimate?target_parameters_billion=70", json=MINIMAL,
                                     headers=org.headers).json()
    by_class = {e["gpu_class"]: e for e in everything["estimates"]}
    assert by_class["l4-24gb"]["gpu_count"] > 1  # a 70B target does not fit one 24 GB card
    assert by_class["h100-80gb"]["total_minutes"] < by_class["l4-24gb"]["total_minutes"]
    assert harness.client.post("/v1/jobs/estimate?gpu_class=tpu", json=MINIMAL, headers=org.headers).status_code == 422


def test_a_mixture_of_experts_is_timed_by_its_active_parameters_and_sized_by_all(harness):
    org = harness.new_org(scopes=("read",))
    body = {"target": {"uri": "hf://Qwen/Qwen3-30B-A3B"}, "data": {"source": "hf://acme/prompts", "count": 1000}}
    moe = harness.client.post("/v1/jobs/estimate", json=body, headers=org.headers).json()
    assert moe["target_parameters_billion"] == 30 and moe["target_active_parameters_billion"] == 3
    dense = harness.client.post("/v1/jobs/estimate?target_active_parameters_billion=30", json=body,
                                headers=org.headers).json()
    assert dense["target_active_parameters_billion"] == 30
    moe_by, dense_by = ({e["gpu_class"]: e for e in r["estimates"]} for r in (moe, dense))
    for gpu in ("l4-24gb", "h100-80gb"):
        assert moe_by[gpu]["gpu_count"] == dense_by[gpu]["gpu_count"]  # memory: every expert
        assert moe_by[gpu]["generation_minutes"] == pytest.approx(dense_by[gpu]["generation_minutes"] / 10, rel=0.02)
    assert moe_by["l4-24gb"]["gpu_count"] > 1
    assert any("active" in line for line in moe["assumptions"])


def test_the_estimate_prices_the_cpu_and_gpu_presets(harness):
    """Both recipe presets priced on the same spec: the preset fills what the spec leaves unset, never more."""
    org = harness.new_org(scopes=("read",))
    body = {**MINIMAL, "training": {"learning_rate": 1e-3}}
    estimate = harness.client.post("/v1/jobs/estimate?gpu_class=h100-80gb&gpu_count=2", json=body,
                                   headers=org.headers).json()
    presets = {p["preset"]: p for p in estimate["presets"]}
    assert set(presets) == {"cpu", "gpu"}
    cpu, gpu = presets["cpu"], presets["gpu"]
    # The cpu preset is today's defaults: the spec priced as it is.
    assert cpu["training_steps"] == estimate["training_steps"] == recipe.TRAIN_STEPS
    assert cpu["estimates"] == estimate["estimates"]
    assert gpu["fields"]["drafter.block_size"] == recipe.GPU_BLOCK_SIZE
    assert gpu["fields"]["drafter.num_layers"] == recipe.GPU_NUM_LAYERS
    assert "training.learning_rate" not in gpu["fields"] and "training.learning_rate" not in cpu["fields"]
    assert gpu["drafter_tokens_per_step"] == (recipe.GPU_BATCH_SIZE * recipe.GPU_ANCHORS_PER_SEQUENCE
                                              * recipe.GPU_BLOCK_SIZE)
    assert gpu["tokens_to_generate"] == gpu["prompts"] * recipe.GPU_MAX_NEW_TOKENS
    assert gpu["estimates"][0]["gpu_count"] == 2 and gpu["estimates"][0]["cost_usd"] > 0
    assert gpu["notes"] and "gpu preset" in gpu["notes"][0]
