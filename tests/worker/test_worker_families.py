"""Targets beyond the dense families, submitted over REST and run by a real worker end to end: a hybrid
linear-attention MoE target (Qwen3.5 MoE: Gated DeltaNet layers, routed experts), a fine-tune handed over as
a LoRA adapter with its base, and an architecture in no table (GLM-4.5's MoE), run on its self-test. All lossless,
all named in report.json as the job gave them."""

from __future__ import annotations

import json

import pytest
from tiny_targets import make_bpe_target
from worker_harness import tiny_spec

pytestmark = pytest.mark.slow


def make_adapter(base_dir, out_dir):
    """A LoRA adapter over `base_dir` as peft saves one, lora_B randomised so the fine-tune differs from its base."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(5)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, 0.5)
    model.save_pretrained(out_dir)
    return out_dir


def report_of(service, job_id: str) -> dict:
    with service.http as http:
        artifacts = {a["name"]: a for a in http.get(f"/v1/jobs/{job_id}/artifacts").json()["data"]}
        return json.loads(http.get(artifacts["report.json"]["download_path"], follow_redirects=True).content)


def test_hybrid_moe_and_adapter_targets_run_over_rest_losslessly(workers, models):
    service = workers
    make_bpe_target(models / "qwen3_5_moe", num_layers=4, arch="qwen3_5_moe")
    make_adapter(models / "bpe", models / "bpe-lora")
    # Served with top-k 4, so the sampling test has cells to test: a random target's full distribution over 49k
    # tokens is nearly flat, and 200 draws would leave it inconclusive.
    sampled = {"validation": {"sampling_draws": 200}, "sampling": {"temperature": 1.0, "top_k": 4}}
    hybrid = service.submit(tiny_spec(f"file://{models}/qwen3_5_moe", **sampled))
    adapter = service.submit(tiny_spec(f"file://{models}/bpe-lora", target={"base": f"file://{models}/bpe"},
                                       **sampled))
    service.start_worker(name="families")

    for job_id, family, named in ((hybrid, "Qwen3.5 MoE (hybrid Gated DeltaNet)", f"file://{models}/qwen3_5_moe"),
                                  (adapter, "Llama", f"file://{models}/bpe-lora")):
        job = service.wait_terminal(job_id, timeout=420)
        assert job["status"] == "succeeded", job["error"]
        report = report_of(service, job_id)
        greedy = report["lossless"]["greedy"]
        assert greedy["mismatches"] == 0 and greedy["tokens"] > 0
        assert report["lossless"]["sampling"]["status"] == "passed"
        assert (report["target"]["family"], report["target"]["name"]) == (family, named)
    assert report["target"]["adapter"] and report["target"]["base"] == f"file://{models}/bpe"


def test_an_architecture_in_no_table_runs_over_rest_on_its_self_test(workers, models):
    """GLM-4.5's MoE (glm4_moe) has no entry in trainer/targets/families.py: a REST job runs it on the contract read
    from the model and the self-test at prepare, lossless, and the self-test's result is in prepare.json."""
    from worker_harness import STORAGE_BUCKET

    service = workers
    make_bpe_target(models / "glm4_moe", num_layers=4, arch="glm4_moe")
    job_id = service.submit(tiny_spec(f"file://{models}/glm4_moe", validation={"sampling_draws": 200},
                                      sampling={"temperature": 1.0, "top_k": 4}))
    service.start_worker(name="unlisted")
    job = service.wait_terminal(job_id, timeout=420)
    assert job["status"] == "succeeded", job["error"]
    report = report_of(service, job_id)
    assert report["lossless"]["greedy"]["mismatches"] == 0 and report["lossless"]["greedy"]["tokens"] > 0
    assert report["lossless"]["sampling"]["status"] == "passed"
    assert report["target"]["family"] == "glm4_moe"  # named by its model type: no table entry
    prepared = json.loads(service.s3().get_object(Bucket=STORAGE_BUCKET,
                                                  Key=f"service/jobs/{job_id}/work/prepare.json")["Body"].read())
    self_test = prepared["self_test"]
    assert self_test["passed"] is True and self_test["failure"] is None
    assert self_test["layer_kinds"] == {"full": 4} and self_test["rollback_by_kind"] == {"full": "crop"}
    assert self_test["drafts_rejected"] > 0 and report["target"]["self_test"]["passed"] is True
