"""bench/recipe_study.py's table: each row's held-out tau and its T=1 tau are set against the row it changes, on
the same prompts (paired), and a row measured on other prompts gets no difference rather than a wrong one."""

from __future__ import annotations

import json
import re

from bench import recipe_study


def _row(name: str, per_prompt: list[tuple[int, int]], sampled: list[tuple[int, int]] | None) -> dict:
    tau = sum(e for e, _ in per_prompt) / sum(c for _, c in per_prompt)
    row = {"row": name, "description": name, "train": {"bf16_matmuls": True}, "tau": tau,
           "tau_ci95": [tau - 0.1, tau + 0.1], "per_prompt": per_prompt, "per_position": [0.2, 0.2, 0.2, 0.2],
           "oracle_tau": 1.9, "train_tau_estimate": 2.0, "steps": 300, "cpu_s_per_step": 2.4,
           "load_before": 1.0, "load_after": 1.0}
    if sampled is not None:
        row["tau_t1"] = sum(e for e, _ in sampled) / sum(c for _, c in sampled)
        row["tau_t1_per_prompt"] = sampled
    return row


def test_the_table_pairs_t1_tau_with_the_reference_row(tmp_path):
    base = _row("bf16", [(12, 10)] * 6, [(11, 10)] * 4)
    better = _row("auf", [(13, 10)] * 6, [(12, 10), (13, 10), (12, 10), (13, 10)])
    other_prompts = _row("init-target", [(12, 10)] * 6, [(12, 10)] * 3)
    unsampled = _row("gamma8", [(12, 10)] * 6, None)
    with open(tmp_path / "results.jsonl", "w") as out:
        for row in (base, better, other_prompts, unsampled):
            out.write(json.dumps(row) + "\n")

    lines = {line.split(" | ")[0].lstrip("| "): line.split(" | ")
             for line in recipe_study.print_table(tmp_path).splitlines()[2:]}
    # auf: every sampled prompt accepts more than bf16's, so the paired interval lies wholly above 0.
    assert lines["auf"][6].startswith("1.250 (+0.150 [+")
    low = float(lines["auf"][6].split("[")[1].split(",")[0])
    assert 0 < low <= 0.15
    assert lines["auf"][3].startswith("+0.100 [")  # the greedy tau's paired difference, vs bf16
    assert lines["bf16"][6] == "1.100"  # the reference itself: no difference to itself
    assert lines["init-target"][6] == "1.200"  # 3 sampled prompts against 4: not paired, so no difference
    assert lines["gamma8"][6] == ""  # not sampled


def _seeded(name: str, seed: int, per_prompt: list[tuple[int, int]]) -> dict:
    return _row(f"{name}@{seed}", per_prompt, None) | {"study_row": name, "seed": seed}


def _write(tmp_path, rows: list[dict]) -> None:
    with open(tmp_path / "results.jsonl", "w") as out:
        for row in rows:
            out.write(json.dumps(row) + "\n")


def test_seeded_rows_pool_into_one_ratio_whose_interval_decides_the_default(tmp_path):
    prompts = [(10 + i % 3, 10) for i in range(12)]  # prompts of varied difficulty
    better = [(e + 2, c) for e, c in prompts]
    _write(tmp_path, [_seeded("bf16", s, prompts) for s in range(3)]
           + [_seeded("dpace0.5", s, better) for s in range(3)]
           + [_seeded("dpace0.3", s, prompts) for s in range(3)]
           # One lucky seed out of three: the seed resampling must not call that a win.
           + [_seeded("dpace0.7", 0, [(e + 6, c) for e, c in prompts]), _seeded("dpace0.7", 1, prompts),
              _seeded("dpace0.7", 2, [(e - 2, c) for e, c in prompts])])

    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ")
            for line in recipe_study.print_ratios(tmp_path).splitlines()[2:]}
    assert rows["bf16"][5].startswith("reference")
    point, low, high = (float(x) for x in re.findall(r"[0-9.]+", rows["dpace0.5"][3]))
    assert abs(point - sum(e for e, _ in better) / sum(e for e, _ in prompts)) < 1e-3
    assert 1 < low <= point <= high
    assert rows["dpace0.5"][5].startswith("better")
    assert rows["dpace0.3"][3].startswith("1.000") and rows["dpace0.3"][5].startswith("no difference")
    assert rows["dpace0.7"][5].startswith("no difference")  # its mean is above bf16, its seeds disagree


def test_seeded_rows_on_other_prompts_are_not_compared(tmp_path):
    base = [_seeded("bf16", s, [(12, 10)] * 6) for s in range(2)]
    other = [_seeded("dpace0.5", s, [(14, 10)] * 5) for s in range(2)]
    assert recipe_study.seed_pooled_ratio(other, base) is None
    _write(tmp_path, base + other)
    assert "not comparable" in recipe_study.print_ratios(tmp_path)
