"""Files inside a checkpoint an organisation hands over, judged by a real worker (`run_job` in this process, on
PostgreSQL and the API's own routes): organisation B's adapter whose adapter_config.json names organisation A's
cached model, a folder outside the allowed roots, /etc, a relative path, a symlink or nothing that exists is refused
at prepare with one message, and the worker process opens none of them (CPython's audit events record every open);
the API refuses such an adapter at submit when it can see it; an absurd config fails the job as a target error; a
cancel during a load that never polls ends the job within seconds."""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from api_harness import Harness, build_harness, make_settings
from file_audit import make_adapter, opened_paths
from services import fresh_postgres_database
from tiny_targets import make_tiny_target

from domain.models import Job
from domain.queue import all_queues
from schemas.job_spec import JobSpec


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Iterator[dict]:
    from migrations.revisions import upgrade

    root = tmp_path_factory.mktemp("hostile")
    models, cache = root / "models", root / "cache"
    url, drop = fresh_postgres_database("draftsmith_hostile_checkpoints")
    upgrade(url)
    try:
        settings = make_settings(url, root / "storage", allowed_file_roots=[str(models)], worker_cache_dir=str(cache),
                                 worker_heartbeat_seconds=0.2, worker_stale_after_seconds=30)
        for harness in build_harness(settings):
            yield {"harness": harness, "models": models, "cache": cache, "root": root}
    finally:
        drop()


@pytest.fixture(scope="module")
def ctx(world):
    from worker.context import WorkerContext

    settings = world["harness"].settings
    return WorkerContext(settings, frozenset(all_queues(settings)))


def inject(harness: Harness, job_id: str, **sections) -> None:
    """A stored spec replaced behind the API's back (what the API would refuse, the worker must refuse too)."""
    with harness.services.session_factory() as session:
        job = session.get(Job, job_id)
        job.spec = JobSpec.model_validate({**job.spec, **sections},
                                          context={"allowed_file_roots": ["/"]}).model_dump(mode="json")
        session.commit()


def outcome(harness: Harness, job_id: str) -> tuple[str, str | None, str, str | None]:
    with harness.services.session_factory() as session:
        job = session.get(Job, job_id)
        return job.status, job.error_code, job.error_message or "", job.error_stage


def test_an_adapter_naming_another_organisation_s_model_is_refused_and_nothing_it_names_is_opened(world, ctx):
    from worker.runner import Outcome, run_job

    harness, models = world["harness"], world["models"]
    a, b = harness.new_org(), harness.new_org()
    # A's private model, as a fetch leaves it in the worker's cache; B's base, and a model outside the roots.
    victim = make_tiny_target(Path(ctx.cache) / "orgs" / a.org_id / "targets" / "hub" / "private", "llama")
    base = make_tiny_target(models / "b-base", "llama", seed=1)
    outside = make_tiny_target(world["root"] / "outside" / "model", "llama", seed=2)
    (models / "b-link").symlink_to(victim)
    named = {"A's cached model": str(victim), "a folder outside the roots": str(outside), "/etc": "/etc",
             "a relative path": f"../cache/orgs/{a.org_id}/targets/hub/private", "a symlink": str(models / "b-link"),
             "nothing": str(models / "no-such-model")}
    messages = {}
    for index, (what, name) in enumerate(named.items()):
        adapter = make_adapter(base, models / f"b-adapter-{index}", name)
        job_id = harness.create_job(b)["id"]
        inject(harness, job_id, target={"uri": adapter.as_uri()})
        with opened_paths() as opened:
            assert run_job(ctx, job_id, lambda job, stage: None) is Outcome.FAILED
        status, code, message, stage = outcome(harness, job_id)
        assert (status, code, stage) == ("failed", "target_base_required", "prepare"), (what, code, message)
        messages[what] = message
        touched = [p for p in opened if p.startswith((str(victim), str(outside), "/etc"))]
        assert touched == [], f"{what}: the worker opened {touched}"
    assert len(set(messages.values())) == 1, messages  # the same words whether or not the folder exists
    assert "target.base" in messages["nothing"] and a.org_id not in messages["A's cached model"]

    # The API sees a file:// adapter at submit and refuses it there, naming the field.
    response = harness.client.post("/v1/jobs", json={"target": {"uri": (models / "b-adapter-0").as_uri()}},
                                   headers=b.headers)
    assert response.status_code == 422, response.text
    assert "target.base" in response.text


def test_an_absurd_config_fails_the_job_as_a_target_error_without_a_worker_path(world, ctx):
    from worker.runner import Outcome, run_job

    harness, models = world["harness"], world["models"]
    org = harness.new_org()
    folder = models / "absurd"
    shutil.copytree(make_tiny_target(world["root"] / "small", "llama"), folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "hidden_size": 10**7, "num_hidden_layers": 100_000}))
    job_id = harness.create_job(org, {"target": {"uri": folder.as_uri()}})["id"]
    started = time.monotonic()
    assert run_job(ctx, job_id, lambda job, stage: None) is Outcome.FAILED
    status, code, message, stage = outcome(harness, job_id)
    assert (status, code, stage) == ("failed", "target_too_large", "prepare"), message
    assert "num_hidden_layers" in message and str(ctx.cache) not in message
    assert time.monotonic() - started < 60


def test_a_cancel_during_a_load_that_never_polls_ends_the_job(world, ctx, monkeypatch):
    """transformers' loader is replaced by one that reads for a minute without asking anyone (a large target on a
    slow disk); the worker must still end the job within seconds of the cancel."""
    from transformers import AutoModelForCausalLM

    from worker.runner import Outcome, run_job

    harness, models = world["harness"], world["models"]
    loading = threading.Event()

    def slow_from_pretrained(*args, **kwargs):
        loading.set()
        started = time.monotonic()
        while time.monotonic() - started < 60:
            sum(range(1000))
        raise AssertionError("the load was not stopped")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", slow_from_pretrained)
    org = harness.new_org()
    target = make_tiny_target(models / "slow", "llama", seed=3)
    job_id = harness.create_job(org, {"target": {"uri": target.as_uri()}})["id"]
    result: dict = {}
    worker = threading.Thread(target=lambda: result.setdefault("outcome", run_job(ctx, job_id, lambda j, s: None)),
                              daemon=True)
    worker.start()
    assert loading.wait(120), "the load never started"
    asked = time.monotonic()
    response = harness.client.post(f"/v1/jobs/{job_id}/cancel", headers=org.headers)
    assert response.status_code in (200, 202), response.text
    worker.join(timeout=20)
    assert not worker.is_alive(), "the worker did not stop the load"
    assert time.monotonic() - asked < 10
    assert result["outcome"] is Outcome.CANCELLED
    assert outcome(harness, job_id)[0] == "cancelled"
