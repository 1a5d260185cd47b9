"""How the files beside this script were made (run once; `python make_sample.py` rewrites them).

They are NOT the output of a run. The headline figures are the main job's as DESIGN.md §6 and the
README report them (`make run`, SmolLM2-135M, block 8, measured 2026-11-30 / 12-01); the keys are
exactly those `trainer.validation.report.validate` writes; values those documents do not give
(cycles per category, the speedup estimate for block sizes other than 3) and the whole training
curve are illustrative. model_card.md is the real model-card template (an export's README.md)
filled with this report. Replace all three with a real main job's files whenever one is at hand
(out/smollm2-135m/report.json, metrics.jsonl, and README.md as model_card.md): the tests read
whatever is here.
"""

import json
import math
import random
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).parent
PER_POSITION = [0.24, 0.25, 0.32, 0.26, 0.14, None, None]  # DESIGN.md §6
CATEGORY_TAU = {"chat": 1.31, "code": 1.29, "instructions": 1.29, "knowledge": 1.30, "math": 1.51, "reasoning": 1.32}


def expected_tau(block_size: int) -> float:
    tau, survive = 1.0, 1.0
    for alpha in PER_POSITION[:block_size - 1]:
        survive *= alpha or 0.0
        tau += survive
    return round(tau, 4)


def report() -> dict:
    categories = {name: {"tau": tau, "cycles": round(4 * 96 / tau)} for name, tau in CATEGORY_TAU.items()}
    return {
        "passed": True, "block_size": 8, "tau": 1.317, "tau_per_position": PER_POSITION,
        "acceptance_by_category": categories, "oracle_tau": 1.93,
        "cycles": sum(c["cycles"] for c in categories.values()),
        "expected_tau_by_block_size": {str(b): expected_tau(b) for b in range(2, 9)},
        "recommended_block_size": 3,
        "estimated_speedup_by_block_size": {"2": 0.81, "3": 0.83, "4": 0.79, "5": 0.74, "6": 0.69, "7": 0.64, "8": 0.6},
        "lossless": {
            "greedy": {"prompts": 24, "mismatches": 0, "first_divergence": None},
            "sampling": {"test": "chi-square goodness of fit of the first 3 sampled tokens against the target's exact "
                                 "probabilities (continuations expected < 5 times pooled)",
                         "p_value": 0.21, "draws": 300, "cells": 2, "temperature": 1.0, "top_p": 1.0, "top_k": 0,
                         "alpha": 0.001, "passed": True},
        },
        "speedup": {"decoding": "greedy, batch 1, measured side by side on this machine",
                    "ar_tokens_per_s": 25.9, "spec_tokens_per_s": 14.9, "ratio": 0.58},
        "sampling_parameters": {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": 128, "seed": 0,
                                "chat_template": {"enable_thinking": None, "system_prompt": None}},
        "validation_max_new_tokens": 96,
        "target_fingerprint": "sha256:illustrative",
    }


def metrics() -> list[dict]:
    rng = random.Random(0)
    final = [0.55, 0.42, 0.33, 0.26, 0.20, 0.16, 0.13]
    rows = []
    for step in range(1, 301):
        progress = 1 - math.exp(-step / 70)
        accuracy = [round(max(0.0, a * progress + rng.gauss(0, 0.015)), 4) for a in final]
        loss = 3.2 + 6.3 * math.exp(-step / 55) + rng.gauss(0, 0.08)
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
    from trainer.export.model_card import model_card

    data = report()
    (HERE / "report.json").write_text(json.dumps(data, indent=2) + "\n")
    (HERE / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in metrics()))
    config = SimpleNamespace(block_size=8, variant="dflash2", num_layers=2, hidden_size=576, mask_token_id=2,
                             target_layer_ids=[1, 14, 27])
    card = model_card(config, SimpleNamespace(fingerprint=data["target_fingerprint"]), data, "smollm2-135m")
    (HERE / "model_card.md").write_text(card)
