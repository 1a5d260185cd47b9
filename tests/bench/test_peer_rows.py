"""bench/peers/compare.py's rows of today's peers: each is judged against our row of the same variant and depth, a peer
that cannot run stays in the table as a row saying why, and the reference `dflash` decoder's judgement of a drafter
agrees with our replay (the same acceptance per prompt, and the target's own tokens)."""

from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path

import pytest
from drafters import random_drafter

from bench.peers import compare
from bench.peers.peer_run import PeerFailed
from bench.peers.reference_decode import reference_score
from schemas import recipe
from schemas.sampling import SamplingParams
from trainer.data.prompts import Prompt
from trainer.drafter.checkpoint import save_drafter
from trainer.validation.replay import greedy_references, replay_acceptance

ARGS = argparse.Namespace(layers=2, steps=60, size_from="", tag="", seed=None, threads=1, taps=[1, 14, 27], block_size=8,
                          batch_size=16, anchors=12, mask_token_id=16, target_dir="/target", data=Path("/data"),
                          peer_dtype="authors")


def test_a_peer_row_is_judged_against_ours_of_the_same_variant_and_depth():
    assert compare.base_row("speculators-dflash2-dpace-authors", ARGS) == "dflash2-steps"
    assert compare.base_row("nemo-dflash-ours", ARGS) == "dflash-steps"
    assert compare.base_row("modelopt-dflash-dpace-authors", ARGS) == "dflash-3l-steps"  # one tap per layer: 3
    assert compare.base_row("specforge-steps", ARGS) == "dflash-steps"
    assert compare.base_row("dflash2-3l-steps", ARGS) is None and compare.base_row("specforge-cpu", ARGS) is None
    assert all(compare.base_row(name, ARGS) in compare.ROWS for name, row in compare.ROWS.items()
               if row.trainer != "ours" and row.budget == "steps")


def test_a_peer_trained_with_dpace_is_also_judged_against_ours_with_dpace():
    assert compare.base_row("speculators-dflash2-dpace-ours", ARGS, dpace=True) == "dflash2-dpace-steps"
    assert compare.base_row("modelopt-dflash-dpace-authors", ARGS, dpace=True) == "dflash-3l-dpace-steps"
    assert compare.base_row("speculators-dflash-authors", ARGS, dpace=True) is None  # D-PACE off: no such pair
    assert compare.base_row("nemo-dflash2-authors", ARGS, dpace=True) is None  # the trainer's default, which has none
    assert compare.base_row("dflash2-dpace-steps", ARGS, dpace=True) is None  # ours are the bases, never paired
    assert all(compare.base_row(name, ARGS, dpace=True) in compare.ROWS for name, row in compare.ROWS.items()
               if row.trainer != "ours" and row.dpace)


def test_a_peer_that_fails_is_a_row_that_says_why(tmp_path, monkeypatch):
    failing = types.ModuleType("failing_peer")

    def train(row, venv):
        assert (row.variant, row.schedule, row.options, row.layers) == ("dflash2", "authors", {"dpace": True}, 2)
        assert row.row_dir.is_dir() and row.steps == 60
        raise PeerFailed("trainer exited 1: no CUDA")

    failing.train = train
    monkeypatch.setitem(sys.modules, "failing_peer", failing)
    monkeypatch.setitem(compare.PEER_MODULES, "speculators", "failing_peer")
    args = argparse.Namespace(**vars(ARGS), work=tmp_path)
    row = compare.run_row("speculators-dflash2-dpace-authors", args, None, None, lambda: pytest.fail("not scored"))
    assert row["failed"] == "PeerFailed: trainer exited 1: no CUDA"
    assert (row["trainer"], row["variant"], row["dpace"], row["steps"]) == ("speculators", "dflash2", True, 60)
    table = "\n".join(compare.steps_table({row["row"]: row}, args))
    assert "| speculators-dflash2-dpace-authors | vLLM speculators 0.9.0 | dflash2 |" in table
    assert "did not run: PeerFailed: trainer exited 1: no CUDA" in table


def test_the_table_gives_ours_over_each_peer_with_the_paired_interval():
    def row(name, trainer, variant, per_prompt):
        tokens, cycles = sum(t for t, _ in per_prompt), sum(c for _, c in per_prompt)
        return {"row": name, "trainer": trainer, "variant": variant, "budget": "steps", "schedule": "authors",
                "dpace": None, "layers": 2, "steps": 60, "tau": tokens / cycles, "tau_ci95": [1.0, 2.0],
                "per_prompt": per_prompt, "per_position": [0.1] * 4, "cpu_s_per_step": 1.0, "load_before": 0.0,
                "load_after": 0.0}

    ours = row("dflash2-steps", "ours", "dflash2", [(30, 20), (30, 24), (30, 15)])
    theirs = row("nemo-dflash2-authors", "nemo_automodel", "dflash2", [(30, 25), (30, 25), (30, 25)])
    table = compare.steps_table({"dflash2-steps": ours, "nemo-dflash2-authors": theirs}, ARGS)
    nemo = next(line for line in table if line.startswith("| nemo-dflash2-authors"))
    ratio = compare.paired_ratio(ours, theirs)
    assert ratio[0] == pytest.approx((90 / 59) / (90 / 75))
    assert f"{ratio[0]:.3f} [{ratio[1]:.3f}, {ratio[2]:.3f}]" in nemo
    assert nemo.split(" | ")[9] == ""  # NeMo's row has no D-PACE, so no D-PACE pair

    ours_dpace = row("dflash2-dpace-steps", "ours", "dflash2", [(30, 20), (30, 20), (30, 20)])
    theirs_dpace = row("speculators-dflash2-dpace-authors", "speculators", "dflash2", [(30, 25), (30, 25), (30, 24)])
    theirs_dpace["dpace"] = True
    table = compare.steps_table({r["row"]: r for r in (ours, ours_dpace, theirs_dpace)}, ARGS)
    line = next(line for line in table if line.startswith("| speculators-dflash2-dpace-authors")).split(" | ")
    by_objective = compare.paired_ratio(ours_dpace, theirs_dpace)
    assert line[9] == f"{by_objective[0]:.3f} [{by_objective[1]:.3f}, {by_objective[2]:.3f}]"
    assert by_objective[0] == pytest.approx((90 / 60) / (90 / 74))


@pytest.mark.parametrize("variant", ["dflash", "dflash2"])
def test_the_reference_decoder_agrees_with_our_replay(tiny_qwen3, variant, tmp_path):
    drafter = random_drafter(tiny_qwen3, variant, block_size=4)
    save_drafter(drafter, tmp_path / "drafter")
    prompts = [Prompt(f"p{i}", "chat", ({"role": "user", "content": " ".join(f"w{(i * 5 + j) % 9}"
                                                                             for j in range(i + 2))},))
               for i in range(4)]
    references = greedy_references(tiny_qwen3, prompts, SamplingParams(), 20, list(drafter.config.target_layer_ids))
    judged = reference_score(tiny_qwen3, tmp_path / "drafter", references, prompts=4, max_new_tokens=20)
    assert judged["greedy_mismatches"] == [] and judged["prompts"] == 4
    replayed = replay_acceptance(tiny_qwen3, drafter, references)
    assert judged["per_prompt"] == [tuple(p) for p in replayed.per_prompt]


def test_peer_precision_follows_the_cpu_and_a_float32_row_says_so(tmp_path, monkeypatch):
    from bench.peers import peer_run
    from trainer.training import objective

    monkeypatch.setattr(objective, "bf16_matmuls_pay_off", lambda device: False)
    assert peer_run.resolve_peer_dtype("auto") == "float32"
    monkeypatch.setattr(objective, "bf16_matmuls_pay_off", lambda device: True)
    assert peer_run.resolve_peer_dtype("auto") == "authors"
    assert peer_run.resolve_peer_dtype("float32") == "float32"
    with pytest.raises(ValueError, match="--peer-dtype"):
        peer_run.resolve_peer_dtype("fp8")

    seen = {}
    failing = types.ModuleType("failing_peer")
    failing.train = lambda row, venv: (seen.setdefault("dtype", row.dtype), (_ for _ in ()).throw(PeerFailed("x")))
    monkeypatch.setitem(sys.modules, "failing_peer", failing)
    monkeypatch.setitem(compare.PEER_MODULES, "nemo_automodel", "failing_peer")
    args = argparse.Namespace(**(vars(ARGS) | {"peer_dtype": "float32"}), work=tmp_path)
    row = compare.run_row("nemo-dflash-authors", args, None, None, lambda: pytest.fail("not scored"))
    assert seen["dtype"] == "float32" and row["peer_dtype"] == "float32"
    assert "| nemo-dflash-authors | NeMo Automodel 0.7.0 (float32) | dflash |" in "\n".join(compare.steps_table(
        {row["row"]: row}, args))


def test_our_full_vocabulary_row_trains_with_the_peers_loss(tmp_path, monkeypatch):
    from trainer.cli import train

    seen = {}

    def run_measured(command, log, env):
        seen["command"] = command
        return 1, 0.0, 0.0  # exits 1: the row records why, nothing trains

    monkeypatch.setattr(compare, "run_measured", run_measured)
    args = argparse.Namespace(**(vars(ARGS) | {"seed": 3}), work=tmp_path)
    row = compare.run_row("dflash2-dpace-fullvocab-steps", args, None, None, lambda: pytest.fail("not scored"))
    assert row["full_vocab_loss"] is True and row["failed"].startswith("PeerFailed: draftsmith train exited 1")
    command = seen["command"]
    params = train.make_context("train", command[command.index("train") + 1:]).params
    assert params["train_on_draft_vocab"] is False and params["position_weighting"] == "dpace"
    assert params["seed"] == 3  # --seed: a second seed of a row of ours
    plain = train.make_context("train", ["--target", "t", "--data", "d", "--out", "o"]).params
    assert plain["train_on_draft_vocab"] is recipe.TRAIN_ON_DRAFT_VOCAB  # without the flag: the recipe's loss
