"""Bench: every target family of trainer/targets/families.py, and the architectures tried beyond it
(tests/tiny_targets.py UNLISTED_CONFIGS: `--families deepseek_v3 glm4_moe lfm2 nemotron_h`), through the whole
pipeline, on this machine.

For each family a random-weight target of that architecture is built from transformers' own config class (the
tests' builder, tests/tiny_targets.py: SmolLM2's real BPE tokenizer, 6 layers, hidden 64; nothing downloaded),
then prepare → generate → train → validate → export runs on it as `draftsmith run --target DIR` would, with a
job small enough for seconds. Printed per family: its layer kinds and their rollback (read from the model), the
prepare self-test's result and time, wall time, held-out tau, greedy mismatches (must be 0), the
speculative-sampling test, and whether a GGUF was written (and why not).

Sampled at temperature 1 with top-k 4, 300 draws: a random target's full distribution over 49k tokens is nearly
flat, which would leave the sampling test without a cell to test. Random weights and 8 training steps: tau is a smoke figure (the drafter has almost nothing to learn from a
random target); what the table shows is that every family runs end to end, losslessly.

    PYTHONPATH=tests python -m bench.target_families [--families qwen3_5 gemma3 ...] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path


def run_family(arch: str, root: Path) -> dict:
    from tiny_targets import make_bpe_target

    from schemas.sampling import SamplingParams
    from trainer.pipeline import Run, RunConfig
    from trainer.training.config import TrainConfig

    target = make_bpe_target(root / arch, num_layers=6, arch=arch)
    config = RunConfig(
        target=str(target), sampling=SamplingParams(temperature=1.0, top_k=4, max_new_tokens=16), num_prompts=40,
        holdout=0.2, num_layers=1, block_size=4,
        train=TrainConfig(steps=8, batch_size=4, anchors_per_sequence=4, checkpoint_every=4),
        generation_batch_size=8, validation_prompts=3, validation_max_new_tokens=12, sampling_draws=300, engines=())
    out = root / f"{arch}-out"
    started = time.perf_counter()
    Run(config, out, lambda *_: None).execute()
    seconds = time.perf_counter() - started
    report = json.loads((out / "report.json").read_text())
    manifest = json.loads((out / "manifest.json").read_text())
    sampling = report["lossless"]["sampling"]
    self_test = report["target"].get("self_test") or {}
    kinds = ", ".join(f"{count} {kind} ({self_test.get('rollback_by_kind', {}).get(kind, '?')})"
                      for kind, count in (report["target"].get("layer_kinds") or {}).items())
    return {"family": report["target"]["family"], "model_type": report["target"]["model_type"], "kinds": kinds,
            "self_test": f"{'passed' if self_test.get('passed') else 'FAILED'} in {self_test.get('seconds')} s",
            "seconds": round(seconds, 1), "tau": report["tau"],
            "greedy": f"{report['lossless']['greedy']['mismatches']} of {report['lossless']['greedy']['tokens']}",
            "sampling": f"{sampling['status']} (p = {sampling['p_value']:.3g})",
            "gguf": any(name.startswith("gguf/") for name in manifest["files"])}


def main() -> None:
    from tiny_targets import FAMILY_CONFIGS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", nargs="+", default=["llama", *sorted(FAMILY_CONFIGS)])
    parser.add_argument("--out", type=Path, help="Where the targets and runs are kept (default: a temporary folder).")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        root = args.out or Path(scratch)
        print("| model_type | family | layers (rollback) | self-test | wall s | tau | greedy mismatches | "
              "sampling test | GGUF |")
        print("|---|---|---|---|---|---|---|---|---|")
        for arch in args.families:
            row = run_family(arch, root)
            print(f"| {arch} | {row['family']} | {row['kinds']} | {row['self_test']} | {row['seconds']} | {row['tau']} | "
                  f"{row['greedy']} | "
                  f"{row['sampling']} | {'yes' if row['gguf'] else 'no'} |", flush=True)


if __name__ == "__main__":
    main()
