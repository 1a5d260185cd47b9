"""How the files beside this script were made (run once; `python make_sample.py` rewrites them).

They are NOT the output of a main-job run. The headline figures are the main job's as DESIGN.md §6 and the
README report them (`make run`, SmolLM2-135M, block 8: 24 held-out prompts, 0.58x speedup, 25.9 -> 14.9
tokens/s, oracle tau 1.93, a sampling check on 2 cells); everything the report derives is derived by the
trainer's own code, in report.json's current shape (trainer/validation/report.py `validate`):

- acceptance (`tau`, `tau_per_position`, `acceptance_by_position`, `acceptance_by_category`, `cycles`) is
  `CategoryStats` fed with draft-verify `Cycle`s: 1,729 cycles whose accepted lengths give the published
  early-position rates (0.24 / 0.25 / 0.32 ...) and, as issue 19 saw, late positions resting on a handful of
  cycles (position 6: 2 of 2, position 7: 1 of 2). The cycles themselves and their split over categories are
  illustrative;
- `serving_advice` is `serving_advice()` on the published ratio with an illustrative 95 % interval;
- sampling_inconclusive.json is the real `sampling_lossless_test` on a tiny random target with too few draws
  (what a job with a small `validation.sampling_draws` gets): status "inconclusive" and its reason;
- the training curve is illustrative, shaped like a real main-job start on this machine (loss 62 at step 1,
  ~17 by step 2, out/smollm2-135m/.work/train/metrics.jsonl of 2026-12-02), then a smooth decay.

model_card.md is the real model-card template (an export's README.md) filled with this report. Replace all of
them with a real main job's files whenever one is at hand (out/smollm2-135m/report.json, metrics.jsonl, and
README.md as model_card.md): the tests read whatever is here.
"""

import json
import math
import random
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).parent
# Cycles accepting exactly k drafts (k = 0..7) of block 8: at least k accepted for 415, 104, 33, 9, 2, 2, 1.
ACCEPTED_LENGTHS = {0: 1314, 1: 311, 2: 71, 3: 24, 4: 7, 5: 0, 6: 1, 7: 1}
CATEGORIES = ["chat", "code", "instructions", "knowledge", "math", "reasoning"]


def acceptance() -> dict:
    from trainer.speculative import Cycle
    from trainer.validation.acceptance import CategoryStats

    cycles = [Cycle(offered=7, accepted=k, emitted=k + 1) for k, n in ACCEPTED_LENGTHS.items() for _ in range(n)]
    random.Random(0).shuffle(cycles)
    stats = CategoryStats(8)
    for index, cycle in enumerate(cycles):
        stats.add(CATEGORIES[index % len(CATEGORIES)], [], [cycle])
    overall = stats.overall
    return {"tau": round(overall.tau, 4),
            "tau_per_position": [None if a is None else round(a, 4) for a in overall.per_position],
            "acceptance_by_position": overall.by_position(),
            "acceptance_by_category": stats.acceptance_by_category(), "cycles": overall.cycles}


def expected_tau(per_position: list, block_size: int) -> float:
    tau, survive = 1.0, 1.0
    for alpha in per_position[:block_size - 1]:
        survive *= alpha or 0.0
        tau += survive
    return round(tau, 4)


def speed() -> dict:
    return {"decoding": "greedy, batch 1, block size 3 (recommended), 8 prompts each decoded by the target alone "
                        "then speculatively, back to back, on this machine",
            "block_size": 3, "prompts": 8, "tau": 1.3, "ar_tokens_per_s": 25.9, "spec_tokens_per_s": 14.9,
            "ratio": 0.58, "ratio_ci95": [0.52, 0.64], "load_average": [2.1, 2.3]}


def report() -> dict:
    from trainer.validation.report import SAMPLING_ALPHA, serving_advice

    measured = acceptance()
    return {
        "passed": True, "block_size": 8, **measured, "oracle_tau": 1.93,
        "acceptance_measured_by": "replay of the target's greedy output (trainer/validation/replay.py)",
        "prompts": 24,
        "expected_tau_by_block_size": {str(b): expected_tau(measured["tau_per_position"], b) for b in range(2, 9)},
        "recommended_block_size": 3,
        "estimated_speedup_by_block_size": {"2": 0.81, "3": 0.83, "4": 0.79, "5": 0.74, "6": 0.69, "7": 0.64, "8": 0.6},
        "lossless": {
            "greedy": {"prompts": 8, "tokens": 768, "mismatches": 0, "first_divergence": None, "block_size": 3},
            "sampling": {"status": "passed", "reason": None,
                         "test": "chi-square goodness of fit of the first 3 sampled tokens against the target's "
                                 "exact probabilities (continuations expected < 5 times pooled)",
                         "p_value": 0.21, "draws": 300, "cells": 2, "temperature": 1.0, "top_p": 1.0, "top_k": 0,
                         "alpha": SAMPLING_ALPHA, "passed": True, "block_size": 3},
        },
        "speedup": speed(),
        "serving_advice": serving_advice(speed(), 3),
        "sampling_parameters": {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": 128, "seed": 0,
                                "chat_template": {"enable_thinking": None, "system_prompt": None}},
        "validation_max_new_tokens": 96,
        "target_fingerprint": "sha256:illustrative",
    }


def inconclusive_sampling() -> dict:
    """The real sampling test with 2 draws on each of 6 prompts: nothing it can test."""
    # Run by hand as a file (`python make_sample.py`), outside pytest, whose `pythonpath` (pyproject.toml) puts tests/
    # on the path for the tests: this script needs tests/ (tiny_targets, drafters), which is not a package.
    sys.path.insert(0, str(HERE.parents[2]))
    from drafters import random_drafter
    from tiny_targets import make_tiny_target

    from schemas.sampling import SamplingParams
    from trainer.speculative import SpeculativeDecoder
    from trainer.targets import load_target
    from trainer.validation.report import SAMPLING_ALPHA
    from trainer.validation.sampling_test import sampling_lossless_test

    with tempfile.TemporaryDirectory() as tmp:
        target = load_target(make_tiny_target(Path(tmp) / "target"))
    decoder = SpeculativeDecoder(target, random_drafter(target, block_size=3, num_layers=1))
    prompts = [[1, 6 + i, 7 + i, 2, 1, 8] for i in range(6)]
    result = sampling_lossless_test(decoder, prompts, SamplingParams(temperature=1.0), draws=12, seed=0)
    assert result["status"] == "inconclusive", result
    return {**result, "alpha": SAMPLING_ALPHA, "passed": False, "block_size": 3}


def metrics() -> list[dict]:
    rng = random.Random(0)
    final = [0.55, 0.42, 0.33, 0.26, 0.20, 0.16, 0.13]
    rows = []
    for step in range(1, 301):
        progress = 1 - math.exp(-step / 70)
        accuracy = [round(max(0.0, a * progress + rng.gauss(0, 0.015)), 4) for a in final]
        # A first-step spike as a real start has (62 at step 1), then a smooth decay to ~3.2.
        loss = 3.2 + 9.0 * math.exp(-step / 50) + 50.0 * math.exp(-(step - 1) / 1.5) + rng.gauss(0, 0.08)
        tau = 1.0
        survive = 1.0
        for a in accuracy:
            survive *= a
            tau += survive
        rows.append({"step": step, "loss": round(loss, 5), "ce": round(loss, 5),
                     "lr": round(2e-3 * min(1.0, step / 30) * (0.5 + 0.5 * math.cos(math.pi * step / 300)), 8),
                     "accuracy_per_position": accuracy, "train_tau_estimate": round(tau, 4),
                     "tokens_per_s": round(680 + rng.gauss(0, 25), 1), "epoch": round(8 * step / 300, 3),
                     "elapsed_s": round(1.93 * step, 1)})
    return rows


if __name__ == "__main__":
    from schemas.validation_report import TargetDescription, ValidationReport
    from trainer.export.model_card import model_card
    from trainer.targets.families import describe

    data = report()
    (HERE / "report.json").write_text(json.dumps(data, indent=2) + "\n")
    (HERE / "sampling_inconclusive.json").write_text(json.dumps(inconclusive_sampling(), indent=2) + "\n")
    (HERE / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in metrics()))
    config = SimpleNamespace(block_size=8, variant="dflash2", num_layers=2, hidden_size=576, mask_token_id=2, draft_vocab_size=8192,
                             target_layer_ids=[1, 14, 27])
    llama = {"model_type": "llama", "num_hidden_layers": 30, "hidden_size": 576}  # SmolLM2-135M's family
    card = model_card(config, SimpleNamespace(fingerprint=data["target_fingerprint"]), ValidationReport.read(data),
                      TargetDescription(name="smollm2-135m", adapter=False, **describe(llama)))
    (HERE / "model_card.md").write_text(card)
