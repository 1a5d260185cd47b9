"""Issue 12 in the control plane, on SQLite and PostgreSQL: published drafters with lineage and their chain, warm
starts that name a drafter (another organisation's is a 404), audits admitted with their defaults resolved and
handed to the worker by task name, monthly quotas (429 naming the limit) and usage, the rollout data in the
`job.succeeded` webhook, and serving-log uploads."""

from __future__ import annotations

import json

from sqlalchemy import delete, select

from domain import runs
from domain.models import Organisation, WebhookDelivery
from domain.queue import RUN_AUDIT_TASK
from domain.states import Stage

SPEC = {"target": {"uri": "bundled:smollm2-135m"}, "drafter": {"block_size": 4, "num_layers": 1},
        "data": {"count": 40}, "validation": {"prompts": 5}}


def succeeded_with_drafter(harness, org, body, *, tau=1.5, parent_tau=None) -> tuple[str, str]:
    """A job run to the end by the stage-runner API, its drafter recorded in the publish stage as the worker does."""
    job_id = harness.create_job(org, body)["id"]
    while True:
        with harness.services.session_factory() as session:
            stage = runs.next_stage(session, job_id)
        if stage is Stage.PUBLISH:
            break
        harness.runner.run_stage(job_id)
    harness.runner.run_stage(job_id, finish=False)
    with harness.services.session_factory() as session:
        drafter_id = runs.record_drafter(
            session, job_id, target_revision="abc123", target_fingerprint="sha256:" + "f" * 32,
            config={"hidden_size": 576, "target_layer_ids": [1, 14, 27], "mask_token_id": 16},
            metrics={"tau": tau, "lossless_passed": True, "greedy_mismatches": 0, "sampling_p_value": 0.4,
                     "recommended_block_size": 3, "parent_tau": parent_tau},
            lineage={"data": {"source": "builtin"}, "code": {"draftsmith": "0.1.0"}}, manifest_sha256="a" * 64)
        runs.finish_stage(session, job_id, Stage.PUBLISH)
    return job_id, drafter_id


def test_drafters_carry_lineage_and_their_chain_and_the_webhook_carries_the_rollout(harness):
    org = harness.new_org()
    hook = harness.client.post("/v1/webhooks", json={"url": "http://127.0.0.1:9/hook", "events": ["job.succeeded"]},
                               headers=org.headers)
    assert hook.status_code == 201, hook.text
    first_job, first = succeeded_with_drafter(harness, org, SPEC, tau=1.5)
    warm = {**SPEC, "init": {"from_drafter": first}, "training": {"max_steps": 100}}
    second_job, second = succeeded_with_drafter(harness, org, warm, tau=1.6, parent_tau=1.2)

    listed = harness.client.get("/v1/drafters", headers=org.headers).json()
    assert [d["id"] for d in listed["data"]] == [second, first]
    assert listed["data"][0]["parent"] == {"id": first, "ref": first}
    assert listed["data"][0]["target"] == {"uri": "bundled:smollm2-135m", "revision": "abc123",
                                           "fingerprint": "sha256:" + "f" * 32}
    assert listed["data"][0]["lineage"]["code"] == {"draftsmith": "0.1.0"}
    detail = harness.client.get(f"/v1/drafters/{second}", headers=org.headers).json()
    assert [link["id"] for link in detail["chain"]] == [second, first]
    assert detail["artifacts_path"] == f"/v1/jobs/{second_job}/artifacts"
    by_job = harness.client.get("/v1/drafters", params={"job_id": first_job}, headers=org.headers).json()
    assert [d["id"] for d in by_job["data"]] == [first]

    with harness.services.session_factory() as session:
        payloads = [json.loads(d.payload) for d in session.scalars(
            select(WebhookDelivery).where(WebhookDelivery.job_id == second_job))]
        # Nothing listens on port 9: leave no pending delivery for the webhook tests sharing this database.
        session.execute(delete(WebhookDelivery).where(WebhookDelivery.job_id.in_([first_job, second_job])))
        session.commit()
    assert harness.client.delete(f"/v1/webhooks/{hook.json()['id']}", headers=org.headers).status_code == 204
    rollout = payloads[0]["data"]["drafter"]
    assert payloads[0]["type"] == "job.succeeded"
    assert rollout["id"] == second and rollout["parent"]["id"] == first
    assert rollout["lossless"] == {"passed": True, "greedy_mismatches": 0, "sampling_p_value": 0.4}
    assert rollout["tau"] == 1.6 and rollout["parent_tau"] == 1.2 and rollout["manifest_sha256"] == "a" * 64
    assert {a["name"] for a in rollout["artifacts"]} >= {"drafter/model.safetensors"}
    assert all(len(a["sha256"]) == 64 and a["download_path"].startswith(f"/v1/jobs/{second_job}/artifacts/")
               for a in rollout["artifacts"])

    other = harness.new_org()  # another organisation sees none of it
    assert harness.client.get("/v1/drafters", headers=other.headers).json()["data"] == []
    assert harness.client.get(f"/v1/drafters/{second}", headers=other.headers).status_code == 404


def test_a_warm_start_names_one_of_the_organisations_drafters_of_the_same_shape(harness):
    owner, stranger = harness.new_org(), harness.new_org()
    _, drafter = succeeded_with_drafter(harness, owner, SPEC)
    before = harness.row_counts()
    response = harness.client.post("/v1/jobs", json={**SPEC, "init": {"from_drafter": drafter}},
                                   headers=stranger.headers)
    assert response.status_code == 404, response.text
    assert response.json()["type"] == "urn:draftsmith:problem:not-found"
    assert drafter in response.json()["detail"] and "init.from_drafter" in response.json()["detail"]
    # What no upgrade bridges: another depth, a DFlash 2 parent for a DFlash job (the parent is DFlash 2).
    for drafter_fields, field, fix in (({"block_size": 4, "num_layers": 2}, "drafter.num_layers",
                                        "set drafter.num_layers to 1"),
                                       ({"block_size": 4, "num_layers": 1, "variant": "dflash"}, "drafter.variant",
                                        "set drafter.variant to 'dflash2'")):
        response = harness.client.post("/v1/jobs", json={**SPEC, "drafter": drafter_fields,
                                                         "init": {"from_drafter": drafter}}, headers=owner.headers)
        assert response.status_code == 422
        assert response.json()["errors"][0]["field"] == field and fix in response.json()["errors"][0]["message"]
    response = harness.client.post("/v1/jobs", json={**SPEC, "init": {"from_drafter": "drf_nope"}},
                                   headers=owner.headers)
    assert response.status_code == 422 and response.json()["errors"][0]["field"] == "init.from_drafter"
    assert harness.row_counts() == before  # nothing was written
    # Another block size is mapped (no weight depends on it): admitted.
    response = harness.client.post("/v1/jobs", json={**SPEC, "drafter": {"block_size": 8, "num_layers": 1},
                                                     "init": {"from_drafter": drafter}}, headers=owner.headers)
    assert response.status_code == 201, response.text


def test_an_audit_is_admitted_with_its_defaults_resolved_and_queued_by_task_name(harness):
    org, stranger = harness.new_org(), harness.new_org()
    _, drafter = succeeded_with_drafter(harness, org, {**SPEC, "sampling": {"temperature": 0.7}}, tau=1.44)
    thresholds = {"keep_min_gain_ratio": 0.8, "warm_start_min_gain_ratio": 0.3, "min_tau": None}
    assert harness.client.put("/v1/audit-thresholds", json=thresholds, headers=org.headers).json() == thresholds
    response = harness.client.post("/v1/audits", json={"drafter": drafter, "target": {"uri": "hf://acme/llama@v4"}},
                                   headers=org.headers)
    assert response.status_code == 201, response.text
    audit = response.json()
    assert response.headers["location"] == f"/v1/audits/{audit['id']}"
    assert audit["status"] == "queued" and audit["drafter_id"] == drafter and audit["recommendation"] is None
    spec = audit["spec"]
    assert spec["data"]["count"] == 40 and spec["validation"]["prompts"] == 5  # the drafter's job's
    assert spec["sampling"]["temperature"] == 0.7 and spec["reference_tau"] == 1.44
    assert spec["thresholds"] == thresholds  # the organisation's
    assert (RUN_AUDIT_TASK, [audit["id"]]) in harness.services.queue.sent
    assert harness.client.get(f"/v1/audits/{audit['id']}", headers=org.headers).json()["id"] == audit["id"]
    listed = harness.client.get("/v1/audits", params={"drafter": drafter}, headers=org.headers).json()
    assert [a["id"] for a in listed["data"]] == [audit["id"]]

    assert harness.client.get(f"/v1/audits/{audit['id']}", headers=stranger.headers).status_code == 404
    response = harness.client.post("/v1/audits", json={"drafter": drafter, "target": {"uri": "hf://acme/llama"}},
                                   headers=stranger.headers)
    assert response.status_code == 404 and drafter in response.json()["detail"]
    response = harness.client.post("/v1/audits", json={"drafter": "bundled:smollm2-135m",
                                                       "target": {"uri": "hf://acme/llama"}}, headers=org.headers)
    assert response.status_code == 422 and response.json()["errors"][0]["field"] == "drafter"
    bad = {**thresholds, "warm_start_min_gain_ratio": 0.95}
    response = harness.client.put("/v1/audit-thresholds", json=bad, headers=org.headers)
    assert response.status_code == 422 and "must not exceed" in response.text


def test_quotas_are_enforced_at_submit_with_a_429_naming_the_limit(harness):
    org = harness.new_org()
    with harness.services.session_factory() as session:
        session.get(Organisation, org.org_id).monthly_tokens_generated = 1000
        session.commit()
    job = harness.create_job(org, SPEC)  # under the limit: admitted
    with harness.services.session_factory() as session:
        runs.record_usage(session, job["id"], Stage.GENERATE, compute_seconds=12.5, tokens_generated=1000)
        runs.record_usage(session, job["id"], Stage.TRAIN, compute_seconds=30, tokens_trained=4096)
    usage = harness.client.get("/v1/usage", headers=org.headers).json()
    assert usage["usage"] == {"compute_seconds": 42.5, "tokens_generated": 1000, "tokens_trained": 4096}
    assert usage["limits"] == {"compute_seconds": None, "tokens_generated": 1000, "tokens_trained": None}
    assert usage["active_jobs"] == 1

    for path, body in (("/v1/jobs", SPEC), ("/v1/audits", {"drafter": "hf://acme/drafter",
                                                           "target": {"uri": "hf://acme/llama"}})):
        response = harness.client.post(path, json=body, headers=org.headers)
        assert response.status_code == 429, response.text
        problem = response.json()
        assert problem["type"] == "urn:draftsmith:problem:quota-exceeded"
        assert problem["limit"] == "tokens_generated" and problem["used"] == 1000 and problem["limit_value"] == 1000
        assert "monthly limit is 1000 (tokens_generated)" in problem["detail"]
        assert int(response.headers["retry-after"]) > 0
    assert harness.client.get("/v1/usage", params={"period": "1999-01"}, headers=org.headers
                              ).json()["usage"]["tokens_generated"] == 0
    assert harness.client.get("/v1/usage", params={"period": "2026-13"}, headers=org.headers).status_code == 422
    assert harness.client.get("/v1/usage", headers=harness.new_org().headers).json()["usage"]["tokens_generated"] == 0


def test_serving_logs_upload_as_prompts_and_non_text_parts_are_refused_by_line(harness):
    org = harness.new_org()
    request = {"model": "support-llama", "temperature": 0.2, "stream": True, "metadata": {"category": "orders"},
               "messages": [{"role": "developer", "content": "Be brief."},
                            {"role": "user", "content": [{"type": "text", "text": "Where is order 7?"}]}],
               "tools": [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]}
    lines = [request, {**request, "messages": [*request["messages"], {"role": "assistant", "content": "Shipped."}]}]
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    response = harness.client.post("/v1/files", files={"file": ("traffic.jsonl", data)}, data={"purpose": "prompts"},
                                   headers=org.headers)
    assert response.status_code == 201, response.text
    assert response.json()["prompt_count"] == 2
    image = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}
    data += (json.dumps(image) + "\n").encode()
    response = harness.client.post("/v1/files", files={"file": ("traffic.jsonl", data)}, data={"purpose": "prompts"},
                                   headers=org.headers)
    assert response.status_code == 422
    error = response.json()["errors"][0]
    assert error["line"] == 3 and "only text parts" in error["message"] and "drop that part" in error["message"]
