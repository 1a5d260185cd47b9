"""A REST job that specialises a parent drafter the customer hands over in another tool's format (vLLM speculators'),
for a fine-tune target (a LoRA adapter over its base), training a drafter adapter: on a real worker, end to end,
lossless, with the parent's origin, its tau before and the new tau after in report.json."""

from __future__ import annotations

from test_parent_formats import write_speculators
from test_worker_families import make_adapter, report_of
from worker_harness import tiny_spec


def test_a_rest_job_specialises_a_speculators_parent_with_a_drafter_adapter(workers, models):
    from drafters import random_drafter

    from trainer.targets import load_target

    service = workers
    make_adapter(models / "bpe", models / "bpe-finetune")
    parent = random_drafter(load_target(models / "bpe"), "dflash", block_size=4, num_layers=1)
    write_speculators(parent, load_target(models / "bpe"), models / "published-parent")
    job_id = service.submit(tiny_spec(f"file://{models}/bpe-finetune", target={"base": f"file://{models}/bpe"},
                                      init={"from_drafter": f"file://{models}/published-parent"},
                                      training={"drafter_adapter": {"rank": 4}}))
    service.start_worker(name="specialise")
    job = service.wait_terminal(job_id, timeout=420)
    assert job["status"] == "succeeded", job["error"]
    report = report_of(service, job_id)
    assert report["lossless"]["greedy"]["mismatches"] == 0 and report["lossless"]["greedy"]["tokens"] > 0
    warm = report["warm_start"]
    assert warm["parent"]["format"] == "speculators" and warm["parent"]["variant"] == "dflash"
    assert warm["parent_tau"] >= 1.0 and warm["tau"] >= 1.0 and warm["advice"] in ("keep_parent", "serve_new")
    assert warm["adapter"]["rank"] == 4 and 0 < warm["adapter"]["trainable_share"] < 1
