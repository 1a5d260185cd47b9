"""bench/specialise.py's pure parts: the budgets each kind trains for, seeds pooled prompt by prompt, the table and
the goal's verdict. No torch, no training: milliseconds."""

from __future__ import annotations

import pytest

from bench.specialise import adapter_lines, budgets, goal_verdicts, pooled_per_prompt, pooled_tau, render_table


def fixed_interval(per_prompt, baseline):
    """Stands in for the bootstrap: a fixed band around the point figure, so the rendering is checked exactly."""
    point = pooled_tau(per_prompt) / (1.0 if baseline is None else pooled_tau(baseline))
    return point - 0.01, point + 0.01


def row(name: str, per_prompt, steps: int = 0, minutes: float | None = None) -> dict:
    return {"row": name, "per_prompt": per_prompt, "tau": pooled_tau(per_prompt), "tau_ci95": [1.0, 2.0],
            "steps": steps, "train_minutes": minutes}


def test_the_quarter_budget_rounds_up_and_keeps_the_main_jobs_warm_up_share():
    plan = budgets(120)
    assert plan["specialised"] == plan["scratch-quarter"] == {"steps": 30, "warmup_steps": 8}
    assert plan["scratch-full"] == {"steps": 120, "warmup_steps": 30}
    assert budgets(61)["specialised"]["steps"] == 16  # a quarter of 61 is 15.25: never less than the share
    assert budgets(1)["specialised"]["steps"] == 1


def test_seeds_pool_prompt_by_prompt():
    pooled = pooled_per_prompt([{"per_prompt": [(10, 5), (6, 6)]}, {"per_prompt": [(8, 4), (3, 3)]}])
    assert pooled == [(18, 9), (9, 9)]
    assert pooled_tau(pooled) == 27 / 18
    assert pooled_per_prompt([]) == []
    with pytest.raises(ValueError, match="different prompt counts"):
        pooled_per_prompt([{"per_prompt": [(1, 1)]}, {"per_prompt": [(1, 1), (2, 2)]}])


def results_of(spec_gain: float) -> dict[str, dict]:
    rows = [row("lora/parent", [(12, 10), (12, 10)])]
    for seed in (0, 1):
        rows.append(row(f"lora/specialised/seed{seed}", [(round(10 * spec_gain * 1.2), 10)] * 2, 15, 1.0))
        rows.append(row(f"lora/scratch-quarter/seed{seed}", [(11, 10)] * 2, 15, 1.0))
        rows.append(row(f"lora/scratch-full/seed{seed}", [(10, 10)] * 2, 60, 3.0))
    return {r["row"]: r for r in rows}


def test_the_table_gives_every_kind_and_the_paired_ratios():
    table = render_table(results_of(1.0), ["lora", "full"], [0, 1], fixed_interval)
    assert "| lora | parent | 0 | 0.00 | 1.200 [1.000, 2.000] | (no seed) |" in table
    assert "| lora | scratch-full | 60 | 3.00 | 1.000 [0.990, 1.010] | 1.000 / 1.000 |" in table
    assert "| lora | specialised / scratch-full | 1.200 [1.190, 1.210] | 1.200 / 1.200 | 2 |" in table
    assert "| lora | specialised / parent | 1.000 [0.990, 1.010] |" in table
    assert "| full | specialised | | | not run | |" in table


def test_the_goal_is_met_only_when_the_interval_clears_it():
    met = goal_verdicts(results_of(1.0), ["lora"], [0, 1], fixed_interval)[0]
    assert "vs scratch-full 1.200 [1.190, 1.210] against 1.10: met" in met
    assert "vs parent 1.000 [0.990, 1.010] against 1.00: not shown" in met
    above = goal_verdicts(results_of(1.25), ["lora"], [0, 1], fixed_interval)[0]
    assert "vs parent 1.250 [1.240, 1.260] against 1.00: met" in above
    assert goal_verdicts({}, ["full"], [0], fixed_interval) == ["full: not enough rows to judge"]


def test_the_adapter_rows_train_at_the_specialisations_budget_and_are_set_against_it():
    assert budgets(120)["adapter"] == budgets(120)["specialised"]
    results = results_of(1.0)
    size = {"rank": 16, "alpha": 32, "trainable_parameters": 400_000, "drafter_parameters": 40_000_000,
            "trainable_share": 0.01, "bytes": 1_600_000, "drafter_bytes": 160_000_000}
    for seed in (0, 1):
        results[f"lora/adapter/seed{seed}"] = {**row(f"lora/adapter/seed{seed}", [(11, 10)] * 2, 15, 0.8),
                                               "adapter_size": size}
    table = render_table(results, ["lora"], [0, 1], fixed_interval)
    assert "| lora | adapter | 15 | 0.80 | 1.100 [1.090, 1.110] | 1.100 / 1.100 |" in table
    assert "| lora | adapter / specialised | 0.917 [0.907, 0.927] | 0.917 / 0.917 | 2 |" in table
    assert adapter_lines(results, ["lora", "full"], [0, 1]) == [
        "lora: adapter rank 16 (alpha 32): 400,000 of the drafter's 40,000,000 parameters (1.00 %), 1.60 MB against "
        "160.00 MB"]
