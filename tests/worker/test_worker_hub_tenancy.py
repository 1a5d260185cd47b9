"""Issue 20, the Hub half, in the worker, on PostgreSQL: before every Hub fetch (target, data source, warm start's
and audit's drafter) and every Hub publish the worker chooses the token by the rule (domain/storage_scope.py), for the
job's organisation, whatever the stored spec says. The deployment's token goes only to a trusted namespace; an
organisation's own secret (`hf.<namespace>`, `hf`, a named token_secret) goes where it points; otherwise nothing
at all is sent, not even a token this machine has (HF_TOKEN), and public repos still work.

The Hub itself is the one thing mocked, because the real Hub cannot be reached from here: tests/hub_standin.py
speaks its HTTP API to huggingface_hub, answers private repos only to tokens allowed to read them, and records the
Authorization header of every request, which is what these tests assert on. Database, storage (a local
directory), the worker's stage runner and huggingface_hub are real. The API's refusals of the same publishes:
tests/api/test_api_hub_tenancy.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from api_harness import Harness, build_harness, make_settings
from drafters import EXPORTED_CONFIG
from hub_standin import HubStandIn
from services import fresh_postgres_database
from sqlalchemy import select

from domain import runs
from domain.models import Audit, Job, new_id
from domain.queue import all_queues
from schemas.job_spec import JobSpec
from trainer.export.record import drafter_record

DEPLOYMENT_TOKEN = "hf_deployment_token_reads_everything_01"
B_TOKEN = "hf_org_b_own_token_reads_orgb_only_0123"
MACHINE_TOKEN = "hf_token_found_on_the_worker_machine_01"
TRUSTED = "draftsmith-models"
MODEL = {"config.json": b'{"model_type": "llama"}', "model.safetensors": b"\0" * 64}
DRAFTER = {"config.json": b'{"block_size": 4}', "model.safetensors": b"\1" * 64}
PROMPTS = {"prompts.jsonl": b'{"prompt": "hello"}\n' * 12}


@pytest.fixture(scope="module")
def hub() -> Iterator[HubStandIn]:
    # The deployment's token may read everything (as a real one might: the case that makes it a confused deputy);
    # organisation B's own token may read and write its namespace only.
    with HubStandIn(DEPLOYMENT_TOKEN, grants={B_TOKEN: {"orgb"}}) as hub:
        for namespace in ("victim", "orgb", TRUSTED):
            hub.put_files(f"{namespace}/model", MODEL)
            hub.put_files(f"{namespace}/drafter", DRAFTER)
            hub.put_files(f"{namespace}/prompts", PROMPTS, kind="dataset")
        hub.put_files("public-ns/prompts", PROMPTS, kind="dataset", private=False)
        yield hub


@pytest.fixture(scope="module")
def harness(tmp_path_factory, hub) -> Iterator[Harness]:
    from migrations.revisions import upgrade

    url, drop = fresh_postgres_database("draftsmith_worker_hub_tenancy")
    upgrade(url)
    try:
        settings = make_settings(url, tmp_path_factory.mktemp("storage"), hf_endpoint=hub.url,
                                 hf_token=DEPLOYMENT_TOKEN, hf_trusted_namespaces=[TRUSTED],
                                 worker_cache_dir=str(tmp_path_factory.mktemp("worker-cache")))
        yield from build_harness(settings)
    finally:
        drop()


@pytest.fixture(scope="module")
def ctx(harness):
    from worker.context import WorkerContext

    return WorkerContext(harness.settings, frozenset(all_queues(harness.settings)))


@pytest.fixture(autouse=True)
def machine_token(monkeypatch, hub):
    """A token in the worker's environment, which huggingface_hub would send when it is given token=None."""
    monkeypatch.setenv("HF_TOKEN", MACHINE_TOKEN)
    hub.calls.clear()


def sent(hub: HubStandIn, repo: str) -> set[str | None]:
    return hub.tokens_sent(f"/{repo}/") | hub.tokens_sent(f"/{repo}")


def inject(harness: Harness, job_id: str, **sections: Any) -> None:
    """Replace a stored job's spec behind the API's back, as a hand-edited row would."""
    with harness.services.session_factory() as session:
        job = session.get(Job, job_id)
        job.spec = JobSpec.model_validate({**job.spec, **sections}).model_dump(mode="json")
        session.commit()


def outcome(harness: Harness, job_id: str) -> tuple[str, str | None, str, str | None]:
    with harness.services.session_factory() as session:
        job = session.get(Job, job_id)
        return job.status, job.error_code, job.error_message or "", job.error_stage


def test_the_deployments_token_is_never_sent_for_an_untrusted_namespace(harness, ctx, hub):
    from worker.audits import execute_audit
    from worker.runner import Outcome, run_job

    b = harness.new_org()  # no Hub secret of its own
    cases = [  # every field that reads from the Hub, aimed at a private repo only the deployment's token can read
        ({"target": {"uri": "hf://victim/model"}}, "victim/model"),
        ({"data": {"source": "hf://victim/prompts"}}, "victim/prompts"),
        ({"init": {"from_drafter": "hf://victim/drafter"}}, "victim/drafter"),
    ]
    for sections, repo in cases:
        job_id = harness.create_job(b)["id"]
        inject(harness, job_id, **sections)
        assert run_job(ctx, job_id, lambda job, stage: None) is Outcome.FAILED
        status, code, message, stage = outcome(harness, job_id)
        assert (status, stage) == ("failed", "prepare") and code in ("target_not_found", "drafter_not_found"), message
        assert f"hf://{repo}" in message and "hf.<namespace> or hf" in message, message
        assert sent(hub, repo) == {None}, (repo, hub.calls)  # asked anonymously, and refused as private
    with harness.services.session_factory() as session:
        audit = Audit(id=new_id("aud_"), org_id=b.org_id, status="queued", drafter_ref="hf://victim/drafter",
                      target_uri="bundled:smollm2-135m", attempts=0,
                      spec={"drafter": "hf://victim/drafter", "target": {"uri": "bundled:smollm2-135m"},
                            "data": {"source": "builtin"}})
        session.add(audit)
        session.commit()
        audit_id = audit.id
    assert execute_audit(ctx, audit_id) == "failed"
    with harness.services.session_factory() as session:
        assert session.scalar(select(Audit.error_code).where(Audit.id == audit_id)) == "drafter_not_found"
    # Hostile publishes stored behind the API's back: refused before anything is sent to the Hub at all.
    for publish in ([{"kind": "hf", "repo": "victim/drafter"}],
                    [{"kind": "hf", "repo": "victim/drafter", "token_secret": "not-stored"}]):
        job_id = harness.create_job(b)["id"]
        for _ in range(5):  # prepare .. export, by the stage-runner API
            harness.runner.run_stage(job_id)
        hub.calls.clear()
        inject(harness, job_id, publish=publish)
        assert run_job(ctx, job_id, lambda job, stage: None) is Outcome.FAILED
        status, code, message, stage = outcome(harness, job_id)
        assert (status, code, stage) == ("failed", "storage_not_allowed", "publish"), message
        assert "publish[0]" in message and hub.calls == [], message
    assert len(hub.repos["model/victim/drafter"].commits) == 1  # never written over
    # A public repo still works without any token.
    from worker.sources import Caller, resolve_prompts

    fetched = resolve_prompts("hf://public-ns/prompts", harness.settings, ctx.cache, caller=Caller(b.org_id, ctx.session_factory))
    assert Path(fetched.path).read_bytes() == PROMPTS["prompts.jsonl"] and sent(hub, "public-ns/prompts") == {None}
    everything = {header for _, _, header in hub.calls}
    assert f"Bearer {DEPLOYMENT_TOKEN}" not in everything and f"Bearer {MACHINE_TOKEN}" not in everything


def test_the_organisations_own_token_is_sent_and_a_trusted_namespace_gets_the_deployments(harness, ctx, hub):
    from worker.drafters import resolve_drafter
    from worker.runner import Outcome, run_job
    from worker.sources import Caller, TargetNotFound, resolve_target

    b = harness.new_org()
    caller = Caller(b.org_id, ctx.session_factory)
    assert harness.client.put("/v1/secrets/hf.orgb", json={"value": f"{B_TOKEN}\n"},
                              headers=b.headers).status_code == 200
    fetched = resolve_target("hf://orgb/model", harness.settings, ctx.cache, caller=caller)
    assert (Path(fetched.path) / "model.safetensors").read_bytes() == MODEL["model.safetensors"]
    assert sent(hub, "orgb/model") == {f"Bearer {B_TOKEN}"}
    assert resolve_drafter("hf://orgb/drafter", ctx, b.org_id).revision == hub.repos["model/orgb/drafter"].commits[-1][0]
    assert sent(hub, "orgb/drafter") == {f"Bearer {B_TOKEN}"}
    trusted = resolve_target(f"hf://{TRUSTED}/model", harness.settings, ctx.cache, caller=caller)
    assert Path(trusted.path, "config.json").is_file() and sent(hub, f"{TRUSTED}/model") == {f"Bearer {DEPLOYMENT_TOKEN}"}
    # hf.orgb is for orgb only; B's default `hf` token goes everywhere else, and the Hub decides what it may read.
    with pytest.raises(TargetNotFound):
        resolve_target("hf://victim/model", harness.settings, ctx.cache, caller=caller)
    assert harness.client.put("/v1/secrets/hf", json={"value": B_TOKEN}, headers=b.headers).status_code == 200
    with pytest.raises(TargetNotFound):
        resolve_target("hf://victim/model", harness.settings, ctx.cache, caller=caller)
    assert sent(hub, "victim/model") == {None, f"Bearer {B_TOKEN}"}

    # A publish, as the API accepted it: B's own namespace with B's own token, the trusted one with the deployment's.
    job_id = harness.create_job(b, {"target": {"uri": "bundled:smollm2-135m"},
                                    "publish": [{"kind": "hf", "repo": "orgb/published"},
                                                {"kind": "hf", "repo": f"{TRUSTED}/b-published"}]})["id"]
    for _ in range(5):  # prepare .. export, by the stage-runner API; then what export registers for publish
        harness.runner.run_stage(job_id)
    with harness.services.session_factory() as session:
        for name, data in (("drafter/config.json", json.dumps(EXPORTED_CONFIG.to_hf_dict()).encode()),
                           ("drafter-record.json", json.dumps(drafter_record(EXPORTED_CONFIG, None).to_json()).encode()),
                           ("manifest.json", json.dumps({"files": {}}).encode())):
            local = Path(ctx.cache) / "upload" / name
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_bytes(data)
            runs.store_artifact(session, harness.services.storage, job_id, name, local, kind="json",
                                content_type="application/json")
    assert run_job(ctx, job_id, lambda job, stage: None) is Outcome.SUCCEEDED, outcome(harness, job_id)
    assert "drafter/config.json" in hub.repos["model/orgb/published"].commits[-1][1]
    assert sent(hub, "orgb/published") == {f"Bearer {B_TOKEN}"}
    assert sent(hub, f"{TRUSTED}/b-published") == {f"Bearer {DEPLOYMENT_TOKEN}"}
    assert f"Bearer {MACHINE_TOKEN}" not in {header for _, _, header in hub.calls}


def test_a_stop_request_ends_a_hub_download_mid_file(harness, ctx, hub):
    """A cancel during prepare is honoured at the next chunk of a large target's download from the Hub (its
    progress updates ask the stage's poll), and a later fetch completes the files."""
    from trainer.errors import StageInterrupted
    from worker.sources import Caller, resolve_target

    weights = bytes(range(256)) * ((48 << 20) // 256)  # several of huggingface_hub's download chunks
    hub.put_files(f"{TRUSTED}/big-model", {"config.json": MODEL["config.json"], "model.safetensors": weights})
    asked = []

    def stop_after_a_few_chunks() -> bool:
        asked.append(1)
        return len(asked) > 2

    caller = Caller(harness.new_org().org_id, ctx.session_factory)
    with pytest.raises(StageInterrupted, match="target: the download stopped on request"):
        resolve_target(f"hf://{TRUSTED}/big-model", harness.settings, ctx.cache, caller=caller,
                       should_stop=stop_after_a_few_chunks)
    assert not any(p.stat().st_size == len(weights) for p in Path(ctx.cache, "targets").rglob("model.safetensors"))
    fetched = resolve_target(f"hf://{TRUSTED}/big-model", harness.settings, ctx.cache, caller=caller)
    assert (Path(fetched.path) / "model.safetensors").read_bytes() == weights
