"""What the comparison benches share (bench/recipe_study.py, bench/peers/compare.py): the held-out references decoded
once per work folder, a drafter's held-out row by replay with its bootstrap interval, the results file rows are
appended to, paired intervals between rows, and the machine's load next to every figure.

Held-out tau is measured by replay (trainer/validation/replay.py): the target decodes each held-out prompt
greedily once, and each drafter is then run against that known output, which is greedy speculative decoding
minus the target's verify passes. Rows measured on the same references are paired: the bootstrap resamples
their prompts together, which is what tells a real +0.02 from noise.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from trainer.atomic import work_lock


def uptime_load() -> float:
    """The 1-minute load average: other work on the machine shows here, not in a row's CPU seconds."""
    return os.getloadavg()[0]


def git_revision() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent).stdout.strip()
    except OSError:
        return "unknown"


def uncommitted(paths=("trainer", "schemas", "kernels")) -> list[str]:
    """Files under `paths` that differ from the commit git_revision() names: a row trained on a working tree that
    others are changing says so."""
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--", *paths], capture_output=True, text=True,
                             cwd=Path(__file__).parent.parent).stdout
    except OSError:
        return []
    return [line[3:] for line in out.splitlines() if line.strip()]


def heldout_prompts(training_prompt_ids: list[str]):
    """The built-in set's held-out prompts (66 at the recipe's share); refuses training data that holds any."""
    from schemas import recipe
    from trainer.data.prompts import load_prompts, split_prompts

    _, holdout = split_prompts(load_prompts(), recipe.HOLDOUT_SHARE)
    leaked = set(p.id for p in holdout) & set(training_prompt_ids)
    if leaked:
        raise SystemExit(f"the training data holds {len(leaked)} held-out prompts (e.g. {sorted(leaked)[0]}); "
                         "regenerate it with the built-in hold-out share")
    return holdout


def heldout_references(target, references_dir: Path, tap_layer_ids: list[int], training_prompt_ids: list[str],
                       max_new_tokens: int | None = None):
    """The target's greedy output on every held-out prompt (heldout_prompts), decoded once into `references_dir`
    and shared by every row (and by concurrent bench processes on the same folder)."""
    from schemas.sampling import SamplingParams
    from trainer.validation import VALIDATION_MAX_NEW_TOKENS
    from trainer.validation.replay import greedy_references, load_references, save_references

    holdout = heldout_prompts(training_prompt_ids)
    with work_lock(references_dir):
        if not (references_dir / "references.json").is_file():
            started = time.perf_counter()
            decoded = greedy_references(target, holdout, SamplingParams(),
                                        max_new_tokens or VALIDATION_MAX_NEW_TOKENS, tap_layer_ids)
            save_references(decoded, references_dir)
            print(f"references: {len(decoded)} held-out prompts decoded in {time.perf_counter() - started:.0f} s",
                  flush=True)
    references = load_references(references_dir)
    return references


def score_drafter(target, drafter, references) -> dict:
    """A drafter's held-out row: tau with its 95 % bootstrap interval over prompts, per-position acceptance,
    oracle tau, tau by category, and the per-prompt (tokens, cycles) that paired intervals resample."""
    from trainer.bootstrap import bootstrap_interval
    from trainer.validation.replay import replay_acceptance

    result = replay_acceptance(target, drafter, references)
    overall = result.stats.overall
    return {
        "tau": round(result.tau, 4), "tau_ci95": [round(v, 4) for v in bootstrap_interval(result.per_prompt)],
        "per_position": [round(a or 0.0, 4) for a in overall.per_position],
        "oracle_tau": round(overall.oracle_tau or 0.0, 4),
        "by_category": result.stats.acceptance_by_category(), "per_prompt": result.per_prompt,
        "prompts": len(references),
    }


def load_results(work: Path) -> dict[str, dict]:
    """Every row of WORK/results.jsonl by name; a row run again replaces the earlier one."""
    path = work / "results.jsonl"
    rows = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                rows[row["row"]] = row
    return rows


def append_result(work: Path, row: dict) -> None:
    work.mkdir(parents=True, exist_ok=True)
    with (work / "results.jsonl").open("a") as handle:
        handle.write(json.dumps(row) + "\n")


def paired_delta(row: dict, base: dict) -> tuple[float, float, float] | None:
    """tau(row) - tau(base) with its paired 95 % interval, or None when they were not measured on the same
    prompts."""
    from trainer.bootstrap import bootstrap_interval

    if len(base["per_prompt"]) != len(row["per_prompt"]):
        return None
    low, high = bootstrap_interval(row["per_prompt"], base["per_prompt"])
    return row["tau"] - base["tau"], low, high


def paired_ratio(row: dict, base: dict, draws: int = 4000, seed: int = 0) -> tuple[float, float, float] | None:
    """tau(row) / tau(base) with the paired percentile-bootstrap 95 % interval (prompts resampled together): the
    statistic a warm-started job's report.json gives (trainer/bootstrap.py `paired_ratio_interval`)."""
    from trainer.bootstrap import paired_ratio_interval

    if len(base["per_prompt"]) != len(row["per_prompt"]):
        return None
    low, high = paired_ratio_interval(row["per_prompt"], base["per_prompt"], draws=draws, seed=seed)
    return row["tau"] / base["tau"], low, high
