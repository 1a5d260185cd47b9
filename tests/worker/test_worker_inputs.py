"""Bad input fails early and clearly: an unusable target fails in `prepare`, before any generation, with a
message naming the problem; wrong storage credentials fail the job without the secret appearing anywhere."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from services import moto_server
from worker_harness import tiny_spec

pytestmark = pytest.mark.slow


def _unusable_targets(models, outside) -> list[tuple[str, str, str]]:
    """(target URI, expected error code, a fragment the message must contain)."""
    shutil.copytree(models / "bpe", outside / "real-model", dirs_exist_ok=True)
    escape = models / "escape"
    escape.unlink(missing_ok=True)
    escape.symlink_to(models / "bpe")  # allowed when the job is admitted; re-pointed outside before it runs
    pickled = models / "pickled"
    pickled.mkdir(exist_ok=True)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(models / "bpe" / name, pickled / name)
    torch.save({"lm_head.weight": torch.zeros(2, 2)}, pickled / "pytorch_model.bin")
    alien = models / "alien"
    shutil.copytree(models / "bpe", alien, dirs_exist_ok=True)
    config = json.loads((alien / "config.json").read_text())
    (alien / "config.json").write_text(json.dumps({**config, "model_type": "not_a_model_type",
                                                   "architectures": ["AlienForCausalLM"]}))
    return [
        (f"file://{models}/no-such-model", "target_not_found", "no such directory"),
        (f"file://{escape}", "target_not_allowed", "outside the allowed roots"),
        (f"file://{pickled}", "target_invalid", "only pickle weights (pytorch_model.bin)"),
        (f"file://{alien}", "target_config_invalid", "does not describe a model transformers can build"),
    ]


def test_unusable_targets_fail_in_prepare_naming_the_problem(workers, models, tmp_path):
    service = workers
    cases = _unusable_targets(models, tmp_path)
    job_ids = [service.submit(tiny_spec(uri)) for uri, _, _ in cases]
    escape = models / "escape"
    escape.unlink()
    escape.symlink_to(tmp_path / "real-model")  # now inside the allowed root, pointing outside it
    service.start_worker(name="inputs")
    for job_id, (uri, code, fragment) in zip(job_ids, cases, strict=True):
        job = service.wait_terminal(job_id, timeout=180)
        assert job["status"] == "failed", uri
        assert job["error"]["stage"] == "prepare" and job["error"]["code"] == code, job["error"]
        assert fragment in job["error"]["message"], job["error"]["message"]
        assert [s["stage"] for s in job["stages"]] == ["prepare"]  # nothing generated
        with service.http as http:  # and the job keeps its data: it can be resumed once the target is fixed
            assert http.post(f"/v1/jobs/{job_id}/resume").json()["status"] == "queued"
            assert http.post(f"/v1/jobs/{job_id}/cancel").status_code == 200


def test_wrong_storage_credentials_fail_the_job_without_revealing_the_secret(workers, models):
    service = workers
    secret = "wrong-secret-Zq81vXf0c9LmT2"
    with moto_server(check_credentials=True) as strict_s3:
        job_id = service.submit(tiny_spec(f"file://{models}/bpe"))
        worker = service.start_worker(name="badcreds", DRAFTSMITH_S3_ENDPOINT_URL=strict_s3,
                                      DRAFTSMITH_S3_ACCESS_KEY_ID="AKIAWRONGWRONGWRONG0",
                                      DRAFTSMITH_S3_SECRET_ACCESS_KEY=secret)
        job = service.wait_terminal(job_id, timeout=180)
        worker.stop()
    assert job["status"] == "failed" and job["error"]["code"] == "storage_error", job["error"]
    assert "object storage refused" in job["error"]["message"] and "DRAFTSMITH_S3_" in job["error"]["message"]
    everything = json.dumps(job) + json.dumps(service.events(job_id)) + worker.log() + \
        (service.root / "api.log").read_text()
    assert secret not in everything
