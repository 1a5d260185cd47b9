"""Issue 32: the CLI against the real API on loopback (uvicorn), jobs driven by the fake stage runner:
`submit --wait` ends with report.json's serving advice (the dashboard's red line), `draftsmith jobs` lists and
filters, `draftsmith download` fetches an existing job's artifacts verified by their sha256 and refuses a job that
has not succeeded (tests/api/test_cli_untrusted_server.py: the same command against a hostile fake server)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from api_harness import Harness, build_harness, make_settings
from click.testing import CliRunner
from live_server import live_server

from api.main import create_app
from domain import runs as stage_runner
from domain.states import Stage
from draftsmith.cli import LAZY_COMMANDS, main

SLOWER = {"enable": False, "summary": "do not enable this drafter on hardware like the validation machine: it decoded "
          "at 0.61x the target alone (95 % interval 0.55-0.67x) at block size 4"}


@pytest.fixture(scope="module")
def server(sqlite_url, tmp_path_factory) -> Iterator[tuple[Harness, str]]:
    root = tmp_path_factory.mktemp("cli")
    harness = next(build_harness(make_settings(sqlite_url, root / "storage")))
    app = create_app(harness.settings)
    app.state.services = harness.services  # the uvicorn app shares the harness's database and storage
    with live_server(app) as base:
        yield harness, base


def cli(base: str, key: str, *args: str):  # noqa: ANN201
    result = CliRunner().invoke(main, [args[0], "--url", base, "--api-key", key, *args[1:]], catch_exceptions=False)
    return result


def drive(harness: Harness, job_id: str, *, report: dict | None = None, fail_at: Stage | None = None) -> None:
    """Run the job's stages as the worker would; validation writes `report` as report.json."""
    if fail_at is not None:
        harness.runner.run_to_end(job_id, fail_at=fail_at)
        return
    while (stage := harness.runner.run_stage(job_id, finish=False)) is not None:
        with harness.services.session_factory() as session:
            if stage is Stage.VALIDATE and report is not None:
                harness.runner._store(session, job_id, "report.json", json.dumps(report).encode(), kind="report",
                                      content_type="application/json")
            stage_runner.finish_stage(session, job_id, stage)


def test_submit_wait_ends_with_the_serving_advice(server):
    harness, base = server
    org = harness.new_org()

    def worker() -> None:  # picks the submitted job up as soon as it exists, as a worker would
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            jobs = httpx.get(f"{base}/v1/jobs", headers=org.headers).json()["data"]
            if jobs:
                drive(harness, jobs[0]["id"], report={"tau": 2.5, "serving_advice": SLOWER})
                return
            time.sleep(0.05)

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    result = cli(base, org.key, "submit", "--target", "bundled:smollm2-135m", "--wait")
    thread.join(timeout=30)
    assert result.exit_code == 0, result.output
    job_id = result.stdout.strip().splitlines()[-1]
    assert job_id.startswith("job_")  # stdout stays the job id alone, for scripts
    assert result.stderr.strip().splitlines()[-1] == SLOWER["summary"]  # the last line a person reads


def test_jobs_lists_newest_first_with_stage_progress_and_the_apis_filters(server):
    harness, base = server
    org = harness.new_org()
    failed = harness.create_job(org, {"target": {"uri": "bundled:smollm2-135m"}, "labels": {"team": "search"}})["id"]
    drive(harness, failed, fail_at=Stage.TRAIN)
    running = harness.create_job(org, {"target": {"uri": "bundled:smollm2-135m"}, "name": "second"})["id"]
    harness.runner.run_stage(running, finish=False)  # prepare, reported half way
    queued = harness.create_job(org)["id"]

    result = cli(base, org.key, "jobs")
    assert result.exit_code == 0, result.output
    header, *rows = result.stdout.strip().splitlines()
    assert header.split() == ["ID", "STATUS", "STAGE", "PROGRESS", "CREATED", "NAME"]
    assert [row.split()[0] for row in rows] == [queued, running, failed]  # newest first
    assert rows[1].split()[1:4] == ["preparing", "prepare", "50%"] and rows[1].endswith("second")
    assert rows[2].split()[1:4] == ["failed", "(fake_failure)", "train"]

    assert cli(base, org.key, "jobs", "--status", "failed").stdout.split()[6] == failed
    labelled = cli(base, org.key, "jobs", "--label", "team:search", "--json")
    assert [job["id"] for job in json.loads(labelled.stdout)] == [failed]
    listed = json.loads(cli(base, org.key, "jobs", "--json", "--limit", "2").stdout)
    assert [job["id"] for job in listed] == [queued, running]
    assert "no jobs match" in cli(base, org.key, "jobs", "--status", "succeeded").stderr

    wrong = cli(base, org.key, "jobs", "--status", "finished")  # the API's 422 names the field and its values
    assert wrong.exit_code == 1 and "status" in wrong.stderr and "'succeeded'" in wrong.stderr
    bad_label = cli(base, org.key, "jobs", "--label", "team")
    assert bad_label.exit_code == 2 and "KEY:VALUE" in bad_label.stderr


def test_download_fetches_every_artifact_verified_and_refuses_a_tampered_one(server, tmp_path: Path):
    harness, base = server
    org = harness.new_org()
    job_id = harness.create_job(org)["id"]
    drive(harness, job_id, report={"tau": 2.5})

    result = cli(base, org.key, "download", job_id, "--out", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(tmp_path / "out")
    names = [a["name"] for a in httpx.get(f"{base}/v1/jobs/{job_id}/artifacts", headers=org.headers).json()["data"]]
    assert {"report.json", "drafter/model.safetensors"} <= set(names)
    for name in names:
        assert (tmp_path / "out" / name).read_bytes() == harness.runner.artifact_bytes[f"{job_id}/{name}"], name
    assert f"{len(names)} artifacts verified in {tmp_path / 'out'}: each by its sha256; the job listed no " \
        "manifest.json" in result.stderr  # the fake worker exports none: the line claims no set check
    assert "downloaded drafter/model.safetensors (4" in result.stderr  # per-file progress where no terminal

    stored = next(path for path in Path(harness.settings.storage_url.removeprefix("file://")).rglob("model.safetensors")
                  if job_id in path.parts)  # this job's, not another test's in the shared storage
    stored.write_bytes(bytes(len(stored.read_bytes())))  # same size, other bytes
    tampered = cli(base, org.key, "download", job_id, "--out", str(tmp_path / "again"))
    assert tampered.exit_code == 1 and "download failed" in tampered.stderr
    assert "drafter/model.safetensors: sha256 differs" in tampered.stderr
    assert not (tmp_path / "again" / "drafter" / "model.safetensors").exists()  # nothing unverified is left
    stored.write_bytes(b"short")  # the server promised more bytes than it has: one line, not a traceback
    cut = cli(base, org.key, "download", job_id, "--out", str(tmp_path / "cut"))
    assert cut.exit_code == 1 and "drafter/model.safetensors: the transfer broke off" in cut.stderr
    assert not list((tmp_path / "cut").rglob("*model.safetensors*"))

    missing = cli(base, org.key, "download", "job_01JAAAAAAAAAAAAAAAAAAAAAAA")
    assert missing.exit_code == 1 and "404" in missing.stderr


def test_download_of_an_unfinished_job_says_where_it_stands_and_fails(server, tmp_path: Path):
    """Not "0 artifacts verified" and exit 0: the job's status and stage, what to run instead, exit 1, no folder."""
    harness, base = server
    org = harness.new_org()
    queued = harness.create_job(org)["id"]
    running = harness.create_job(org)["id"]
    harness.runner.run_stage(running, finish=False)  # prepare, reported half way
    failed = harness.create_job(org)["id"]
    drive(harness, failed, fail_at=Stage.TRAIN)
    cancelled = harness.create_job(org)["id"]
    assert cli(base, org.key, "cancel", cancelled).exit_code == 0

    expected = {
        queued: f"job {queued} is queued: nothing to download yet; run `draftsmith download {queued}` again once "
                "`draftsmith jobs` shows it succeeded",
        running: f"job {running} is preparing (stage prepare, 50%): nothing to download yet",
        failed: f"job {failed} failed (stage train, 0%, error fake_failure): it made nothing to download; "
                f"`draftsmith resume {failed} --download {tmp_path / failed}` runs it on",
        cancelled: f"job {cancelled} was cancelled",
    }
    for job_id, message in expected.items():
        result = cli(base, org.key, "download", job_id, "--out", str(tmp_path / job_id))
        assert result.exit_code == 1, result.output
        assert message in result.stderr and "verified" not in result.stderr, result.stderr
        assert not (tmp_path / job_id).exists()


def test_jobs_and_download_are_registered_lazily():
    assert LAZY_COMMANDS["jobs"] == "draftsmith.jobs_cli:jobs"
    assert LAZY_COMMANDS["download"] == "draftsmith.jobs_cli:download"
    listed = CliRunner().invoke(main, ["--help"]).stdout
    assert "jobs" in listed and "download" in listed


def test_jobs_shows_a_job_whose_worker_went_quiet_as_waiting_for_a_worker(server):
    """The API's words for the status, not its name alone: "waiting for a worker", with the stage it resumes."""
    from test_api_waiting_for_worker import _job_in_training_whose_worker_died, _reap

    harness, base = server
    org = harness.new_org()
    job_id = _job_in_training_whose_worker_died(harness, org)
    assert _reap(harness, job_id) == [(job_id, Stage.TRAIN)]

    result = cli(base, org.key, "jobs")
    assert result.exit_code == 0, result.output
    row = next(line for line in result.stdout.splitlines() if line.startswith(job_id))
    assert row.split()[1:6] == ["waiting", "for", "a", "worker", "train"]
    refused = cli(base, org.key, "download", job_id)
    assert refused.exit_code == 1 and f"job {job_id} is waiting for a worker (stage train" in refused.stderr
