"""Bench: the decoder's confidence-driven draft length against the fixed block, timed on this machine, small scale.

A tiny learnable target (tests/tiny_targets.py, init_std 0.25: peaked logits a few steps can learn), a DFlash 2
drafter trained on its regenerated answers for a few dozen steps, then two disjoint sets of held-out prompts:

1. calibration: `validate()` on the first set gives the confidence map, its AUC and ECE, the measured step costs, the
   recommended block and report.json's replayed adaptive-length row;
2. timing: on the second set, each prompt is decoded greedily at batch 1 with the fixed recommended block and with
   the adaptive length (the map from 1, the step costs from 1), back to back, in alternating order; both outputs must
   be equal (lossless). Printed: tau and tokens/s of each, and the adaptive/fixed ratios with paired 95 % bootstrap
   intervals over prompts (trainer/bootstrap.py).

    python -m bench.adaptive_length [--work /tmp/adaptive-bench] [--steps 300] [--train-prompts 96] [--timed-prompts 24] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def prompts(start: int, count: int, category: str = "c"):
    """Prompts start..start+count-1: prompt i is 6-10 words of the tiny vocabulary drawn with seed i, so disjoint
    ranges give different prompts (training, calibration and timed sets never share one)."""
    import random

    from trainer.data.prompts import Prompt

    vocabulary = [f"w{n}" for n in range(200)]

    def words(i: int) -> str:
        rng = random.Random(i)  # a pick per word (the same draws as randrange(200)), not a resample
        return " ".join(rng.choice(vocabulary) for _ in range(6 + i % 5))

    return [Prompt(f"p{i}", category, ({"role": "user", "content": words(i)},)) for i in range(start, start + count)]


def train(work: Path, steps: int, count: int):
    """(target, drafter): the tiny target and a DFlash 2 drafter trained on its answers to `count` prompts."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from tiny_targets import make_tiny_target

    from schemas.sampling import SamplingParams
    from trainer.data.regenerate import regenerate
    from trainer.drafter.checkpoint import load_drafter
    from trainer.drafter.config import DrafterConfig
    from trainer.targets import load_target
    from trainer.training.config import TrainConfig
    from trainer.training.loop import Trainer

    target = load_target(make_tiny_target(work / "target", "qwen3", init_std=0.25))
    taps = [1, 2, 3]
    data = regenerate(target, prompts(0, count), SamplingParams(max_new_tokens=32), work / "data", tap_layer_ids=taps)
    config = DrafterConfig.for_target(target, variant="dflash2", num_layers=1, block_size=8, mask_token_id=7,
                                      target_layer_ids=taps, selector_rank=16, selector_top_k=16)
    cfg = TrainConfig(steps=steps, batch_size=8, anchors_per_sequence=8, lr=3e-3, warmup_steps=5, init="random")
    drafter_dir = Trainer(target, data, work / "run", config, cfg).run()
    return target, load_drafter(drafter_dir).eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("/tmp/adaptive-bench"))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--train-prompts", type=int, default=96)
    parser.add_argument("--calibration-prompts", type=int, default=24)
    parser.add_argument("--timed-prompts", type=int, default=24)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="Write the figures as JSON here.")
    args = parser.parse_args()

    import torch

    from schemas.sampling import SamplingParams
    from trainer.bootstrap import paired_ratio_interval, ratio_of_sums
    from trainer.confidence import ConfidenceMap, VerifyLength
    from trainer.speculative import SpeculativeDecoder
    from trainer.validation import served_prompt_ids
    from trainer.validation.report import validate

    torch.set_num_threads(args.threads)
    args.work.mkdir(parents=True, exist_ok=True)
    target, drafter = train(args.work, args.steps, args.train_prompts)
    calibration = prompts(100_000, args.calibration_prompts)  # held out: far from the training range 0..
    report = validate(target, drafter, calibration, SamplingParams(temperature=0.0),
                      max_new_tokens=args.max_new_tokens, sampling_draws=30, sampling_prompts=1)
    confidence = report.confidence
    costs_ms = report.step_costs_ms
    costs = {"draft": {int(b): v / 1000 for b, v in costs_ms.draft.items()},
             "verify": {int(b): v / 1000 for b, v in costs_ms.verify.items()}}
    fixed = SpeculativeDecoder(target, drafter, block_size=report.recommended_block_size)
    rule = VerifyLength.from_costs(ConfidenceMap.from_json(confidence.map.to_json()), costs)
    adaptive = SpeculativeDecoder(target, drafter, verify_length=rule)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=args.max_new_tokens)
    timed = prompts(200_000, args.timed_prompts)
    rows: dict[str, dict[str, list]] = {"fixed": {"tau": [], "speed": []}, "adaptive": {"tau": [], "speed": []}}
    load_before = os.getloadavg()[0]
    for index, ids in enumerate(served_prompt_ids(target, timed, greedy)):
        order = [("fixed", fixed), ("adaptive", adaptive)]
        outputs = {}
        for name, decoder in order if index % 2 == 0 else order[::-1]:
            started = time.perf_counter()
            result = decoder.generate(ids, greedy)
            seconds = time.perf_counter() - started
            outputs[name] = result.tokens
            rows[name]["tau"].append((sum(result.acceptance_lengths), len(result.cycles)))
            rows[name]["speed"].append((len(result.tokens), seconds))
        assert outputs["fixed"] == outputs["adaptive"], f"prompt {index}: the adaptive length changed the output"
    figures = {
        "confidence": {k: getattr(confidence, k) for k in ("positions", "acceptance_rate", "auc", "ece",
                                                             "ece_uncalibrated")},
        "replayed_adaptive_row": confidence.adaptive_length.to_json(),
        "recommended_block_size": report.recommended_block_size, "trained_block_size": drafter.config.block_size,
        "step_costs_ms": costs_ms.to_json(), "map": confidence.map.to_json(),
        "timed_prompts": len(timed), "threads": args.threads,
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }
    for name in rows:
        figures[f"tau_{name}"] = round(ratio_of_sums(rows[name]["tau"]), 4)
        figures[f"tokens_per_s_{name}"] = round(ratio_of_sums(rows[name]["speed"]), 2)
    for what in ("tau", "speed"):
        ratio = ratio_of_sums(rows["adaptive"][what]) / ratio_of_sums(rows["fixed"][what])
        interval = paired_ratio_interval(rows["adaptive"][what], rows["fixed"][what])
        figures[f"{what}_ratio"] = round(ratio, 4)
        figures[f"{what}_ratio_ci95"] = [round(v, 4) for v in interval]
    print(json.dumps(figures, indent=2))
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
