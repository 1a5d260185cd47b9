"""The fine-tune pipeline recipe (examples/pipeline/drafter-pipeline.sh) end to end against `draftsmith serve`:
a first checkpoint gets a drafter trained from scratch, a new fine-tune of it (made here: a few optimizer steps
on other text) is audited and gets a warm-started drafter whose lineage names its parent, the same checkpoint
again keeps it, and an unreachable checkpoint stops the pipeline with a message naming it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch
from services import DraftsmithProcess, free_port, inherited_env
from worker_harness import tiny_spec

pytestmark = pytest.mark.slow
KEY = "dsk_dev_pipeline_test_key"
SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "pipeline" / "drafter-pipeline.sh"


def fine_tuned_copy(base: Path, out: Path, steps: int = 3) -> Path:
    """Another fine-tune of the same base: a few AdamW steps of the whole model on other text."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if (out / "config.json").is_file():
        return out
    torch.manual_seed(2)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(base)
    text = tokenizer(["Release notes: the drafter follows every new checkpoint of the model."] * 4,
                     return_tensors="pt")["input_ids"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(steps):
        model(input_ids=text, labels=text).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    for name in ("tokenizer_config.json",):  # keep the base's exact tokenizer settings
        (out / name).write_bytes((base / name).read_bytes())
    return out


def test_the_pipeline_script_retrains_warm_starts_and_keeps_against_draftsmith_serve(tmp_path, models):
    fine_tuned_copy(models / "bpe", models / "bpe-v2")
    data_dir, port = tmp_path / "data", free_port()
    env = {**inherited_env("DRAFTSMITH_"),
           "DRAFTSMITH_ALLOWED_FILE_ROOTS": str(models), "DRAFTSMITH_DEV_API_KEY": KEY}
    server = DraftsmithProcess(["serve", "--port", str(port), "--data-dir", str(data_dir)], env, tmp_path / "serve.log")
    url = f"http://127.0.0.1:{port}"
    wrapper = tmp_path / "draftsmith"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m draftsmith.cli "$@"\n')
    wrapper.chmod(0o755)
    spec = tmp_path / "job.json"
    spec.write_text(json.dumps({k: v for k, v in tiny_spec("bundled:smollm2-135m").items() if k != "target"}))
    github_output = tmp_path / "github_output"
    script_env = {**env, "DRAFTSMITH_URL": url, "DRAFTSMITH_API_KEY": KEY, "DRAFTSMITH": str(wrapper),
                  "JOB_SPEC": str(spec), "WARM_STEPS": "4", "GITHUB_OUTPUT": str(github_output)}

    def pipeline(checkpoint: str, **extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(SCRIPT), checkpoint], env={**script_env, **extra}, capture_output=True,
                              text=True, timeout=900)

    try:
        server.wait_ready(url)
        http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=30)

        first = pipeline(f"file://{models}/bpe")  # no drafter yet: a drafter from scratch
        assert first.returncode == 0, first.stderr[-3000:] + server.log()[-2000:]
        first_id = first.stdout.strip()
        assert re.fullmatch(r"drf_[0-9A-Z]{26}", first_id) and "no drafter yet" in first.stderr

        # A new fine-tune: the audit runs, and (by this threshold) the drafter is warm-started.
        second = pipeline(f"file://{models}/bpe-v2", AUDIT_ARGS="--warm-start-min-gain-ratio 0")
        assert second.returncode == 0, second.stderr[-3000:] + server.log()[-2000:]
        second_id = second.stdout.strip()
        assert second_id != first_id and "recommendation: warm_start" in second.stderr
        assert "fingerprint changed" in second.stderr  # the audit's summary: the fine-tune moved the embeddings
        drafter = http.get(f"/v1/drafters/{second_id}").json()
        assert [link["id"] for link in drafter["chain"]] == [second_id, first_id]
        assert drafter["parent"] == {"id": first_id, "ref": first_id}
        assert drafter["target"]["uri"] == f"file://{models}/bpe-v2"
        assert drafter["lineage"]["recipe"]["training"]["max_steps"] == 4  # the warm start's smaller budget
        assert drafter["lineage"]["code"]["packages"]["torch"] and drafter["lineage"]["data"]["snapshot"]["files"]
        assert drafter["metrics"]["parent_tau"] is not None and drafter["lossless"] is True
        # Its shape, metrics and serving flags are the export's drafter-record.json, as written.
        artifacts = {a["name"]: a for a in http.get(drafter["artifacts_path"]).json()["data"]}
        record = json.loads(http.get(artifacts["drafter-record.json"]["download_path"], follow_redirects=True).content)
        assert (drafter["config"], drafter["metrics"]) == (record["shape"], record["metrics"])
        assert artifacts["drafter-record.json"]["kind"] == "drafter-record"
        audits = http.get("/v1/audits", params={"drafter": first_id}).json()["data"]
        assert audits[0]["status"] == "succeeded" and audits[0]["recommendation"] == "warm_start"
        assert audits[0]["result"]["compatibility"]["hidden_size"]["ok"]
        usage = http.get("/v1/usage").json()["usage"]
        assert usage["tokens_trained"] > 0 and usage["tokens_generated"] > 0 and usage["compute_seconds"] > 0
        assert "action=warm_start" in github_output.read_text()

        # The same checkpoint again: nothing to train.
        third = pipeline(f"file://{models}/bpe-v2", DRAFTER=second_id, AUDIT_ARGS="--min-tau 1.0")
        assert third.returncode == 0, third.stderr[-3000:]
        assert third.stdout.strip() == second_id and "keeping" in third.stderr
        assert len(http.get("/v1/drafters").json()["data"]) == 2

        missing = pipeline(f"file://{models}/missing", DRAFTER=second_id)
        assert missing.returncode == 2, missing.stderr[-3000:]
        assert "target_not_found" in missing.stderr and f"{models}/missing" in missing.stderr
    finally:
        server.stop()


def test_the_pipeline_script_stops_with_3_when_a_lossless_check_fails(tmp_path):
    """The exit status a CI system acts on: a stand-in `draftsmith` whose audit reports a failed lossless check."""
    stub = tmp_path / "draftsmith"
    stub.write_text('#!/bin/sh\ncase "$1" in audit) echo "error: the lossless check failed" >&2; exit 3;; '
                    '*) echo "[]";; esac\n')
    stub.chmod(0o755)
    result = subprocess.run(["bash", str(SCRIPT), "hf://acme/llama@v5"], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "DRAFTSMITH_URL": "http://127.0.0.1:9", "DRAFTSMITH": str(stub),
                                 "DRAFTER": "drf_01M8S0T13FEPFYAFQBV0N1EZB5"})
    assert result.returncode == 3 and "lossless check failed" in result.stderr and result.stdout == ""
    usage = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert usage.returncode == 1 and "usage:" in usage.stderr
