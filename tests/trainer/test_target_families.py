"""Every target family of trainer/targets/families.py, on tiny random-weight targets built from transformers' own
config classes (tests/tiny_targets.py FAMILY_CONFIGS; nothing downloaded): greedy speculative decoding equals the
target alone token for token in float32, a recurrent state is put back exactly (and merely cropping it is
caught), sampling follows the target's distribution on a hybrid linear-attention target, and `draftsmith run`'s
pipeline goes from prepare to export on every family."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from drafters import random_drafter
from test_lossless_sampling import CASES, goodness_of_fit
from test_pipeline import small_run_config
from tiny_targets import FAMILY_CONFIGS, make_bpe_target, make_tiny_target

from schemas.sampling import SamplingParams
from trainer.speculative import SpeculativeDecoder
from trainer.targets import load_target
from trainer.targets.families import Rollback, describe
from trainer.targets.self_test import run_self_test

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=40)


def prompts(count: int, vocab_size: int, seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(5, vocab_size, (int(torch.randint(1, 20, (1,), generator=generator)),),
                          generator=generator).tolist() for _ in range(count)]


@pytest.fixture(scope="module", params=sorted(FAMILY_CONFIGS))
def family_target(request, tmp_path_factory):
    return load_target(make_tiny_target(tmp_path_factory.mktemp(request.param), request.param))


@pytest.mark.parametrize(("variant", "block_size"), [("dflash2", 8), ("dflash", 4)])
def test_greedy_speculative_output_is_the_targets_own_on_every_family(family_target, variant, block_size):
    """An untrained drafter: almost every draft is rejected, so every cycle puts the cache back."""
    drafter = random_drafter(family_target, variant, block_size=block_size, seed=block_size)
    speculative, alone = SpeculativeDecoder(family_target, drafter), SpeculativeDecoder(family_target)
    for prompt in prompts(3, family_target.vocab_size, seed=block_size):
        expected = alone.generate(prompt, GREEDY, stop_token_ids=[])
        got = speculative.generate(prompt, GREEDY, stop_token_ids=[])
        assert got.tokens == expected.tokens
        assert sum(got.acceptance_lengths) == len(got.tokens) - 1


def test_the_contract_read_from_the_model_describes_each_family_as_the_table_did(family_target):
    """The twelve families' description (layer kinds, rollback, MoE, embedding scale, soft-cap) now comes from the
    loaded model and its cache: it must say what the config-only table says, and the self-test must pass."""
    from_config = describe(family_target.model.config.to_dict())
    assert {key: family_target.family[key] for key in from_config} == from_config
    result = run_self_test(family_target)
    assert result.passed, result.failure


@pytest.fixture(scope="module")
def hybrid_target(tmp_path_factory):
    return load_target(make_tiny_target(tmp_path_factory.mktemp("qwen3_5"), "qwen3_5"))


def test_a_recurrent_state_merely_cropped_is_caught(hybrid_target):
    """Qwen3.5's Gated DeltaNet layers carry a state that a crop cannot take back: decoding that only crops
    diverges from the target alone, and the decoder's own rollback (restore and replay) does not."""
    assert hybrid_target.rollback is Rollback.REPLAY
    drafter = random_drafter(hybrid_target, "dflash2", block_size=8, seed=1)
    cases = prompts(6, hybrid_target.vocab_size)
    alone = [SpeculativeDecoder(hybrid_target).generate(p, GREEDY, stop_token_ids=[]).tokens for p in cases]
    exact = [SpeculativeDecoder(hybrid_target, drafter).generate(p, GREEDY, stop_token_ids=[]).tokens for p in cases]
    assert exact == alone
    hybrid_target.rollback = Rollback.CROP
    try:
        cropped = [SpeculativeDecoder(hybrid_target, drafter).generate(p, GREEDY, stop_token_ids=[]).tokens
                   for p in cases]
        planted = run_self_test(hybrid_target)
    finally:
        hybrid_target.rollback = Rollback.REPLAY
    assert cropped != alone
    assert not planted.passed and planted.layer_kind == "linear" and "recurrent_states" in planted.failure


def test_rewinding_to_one_mark_twice_restores_the_same_state(hybrid_target):
    """A mark is a copy: rewinding to it, decoding on, then rewinding again starts from the same state."""
    target = hybrid_target
    cache = target.new_cache()
    target.forward(torch.tensor([[5, 6, 7, 8]]), cache=cache)
    mark = target.mark(cache)
    nxt = torch.arange(4, 7)[None]
    first, _ = target.forward(torch.tensor([[9, 10, 11]]), nxt, cache=cache)
    target.rewind(cache, mark, [])
    target.forward(torch.tensor([[12, 13, 14]]), nxt, cache=cache)
    target.rewind(cache, mark, [])
    again, _ = target.forward(torch.tensor([[9, 10, 11]]), nxt, cache=cache)
    assert torch.equal(first, again)


def test_sampling_follows_the_target_on_a_hybrid_linear_attention_target(tmp_path):
    peaked = load_target(make_tiny_target(tmp_path / "peaked", "qwen3_5", vocab_size=16, hidden_size=32,
                                          num_layers=4, init_std=0.3, seed=3))
    drafter = random_drafter(peaked, "dflash2", block_size=3, selector_top_k=8, selector_rank=8, scale=0.5)
    assert goodness_of_fit(peaked, drafter, CASES[0][1]) > 1e-3


def test_the_family_table_records_what_the_pipeline_relies_on(tmp_path):
    qwen35 = describe(json.loads((make_tiny_target(tmp_path / "q", "qwen3_5") / "config.json").read_text()))
    assert qwen35["layer_kinds"] == {"full": 1, "linear": 5}  # one full-attention layer in four
    assert qwen35["rollback"] == "replay" and not qwen35["moe"]
    gemma = describe(json.loads((make_tiny_target(tmp_path / "g", "gemma3") / "config.json").read_text()))
    assert gemma["embedding_scale"] == pytest.approx(8.0) and gemma["final_logit_softcap"] == 30.0
    assert gemma["rollback"] == "crop" and "sliding" in gemma["layer_kinds"] and gemma["gguf"]
    oss = describe(json.loads((make_tiny_target(tmp_path / "o", "gpt_oss") / "config.json").read_text()))
    assert oss["moe"] and oss["active_expert_fraction"] == 0.5


# Gemma 3 over a byte-level BPE vocabulary (no tokenizer.model) gets the BPE GGUF, as llama.cpp's converter writes
# it; Gemma 4's export reads byte-fallback BPE only, which SmolLM2's is not
NO_GGUF = {"gemma4": "byte-fallback BPE",
           # transformers maps this model_type's tokenizer to Qwen3.5's class, whose pre-tokenizer llama.cpp
           # cannot name on SmolLM2's vocabulary: export goes on without the GGUF and says why
           "qwen3_5_moe": "pre-tokenizer"}


@pytest.mark.parametrize("arch", sorted(FAMILY_CONFIGS))
def test_the_pipeline_runs_prepare_to_export_on_every_family(arch, tmp_path):
    """Every stage on each family beyond the dense four: lossless greedy, the sampling test passing (served with
    top-k 4, so a random target's flat distribution still leaves cells to test), the report and the card naming
    the family, the GGUF written or its absence explained. The sampling test runs with the fewest draws that
    test something (20 a prompt: the first token's cells and the PIT of every drafted token): here it shows the
    check runs on the family; the exactness of sampling per layer kind is tested with 1,000 draws above and in
    test_lossless_sampling.py, where a planted bug fails it."""
    from trainer.pipeline import Run

    target = make_bpe_target(tmp_path / arch, num_layers=4, arch=arch)
    out = tmp_path / "out"
    config = dataclasses.replace(small_run_config(target), sampling_draws=60,
                                 sampling=SamplingParams(temperature=1.0, top_k=4, max_new_tokens=16))
    Run(config, out, lambda *_: None).execute()
    report = json.loads((out / "report.json").read_text())
    assert report["lossless"]["greedy"]["mismatches"] == 0 and report["lossless"]["greedy"]["tokens"] > 0
    assert report["lossless"]["sampling"]["status"] == "passed", report["lossless"]["sampling"]
    family = describe(json.loads((target / "config.json").read_text()))
    assert (report["target"]["family"], report["target"]["engines"]) == (family["family"], family["engines"])
    assert report["target"]["adapter"] is False
    manifest = json.loads((out / "manifest.json").read_text())
    card = (out / "README.md").read_text()
    assert "target family: " + family["family"] in card
    assert ("gguf/drafter-f16.gguf" in manifest["files"]) == (arch not in NO_GGUF)
    if arch in NO_GGUF:
        assert "no GGUF (" in card and NO_GGUF[arch] in card


def test_a_mixture_of_experts_counts_its_active_share_for_time(tmp_path):
    """Memory is every parameter; a token runs through top-k of E experts (2 of 4 here)."""
    from trainer.cli_run import target_parameters_billion
    from trainer.targets.placement import active_parameters, target_parameters

    folder = make_tiny_target(tmp_path / "moe", "qwen3_moe")
    config = json.loads((folder / "config.json").read_text())
    model = load_target(folder).model
    total = sum(p.numel() for p in model.parameters())
    experts = sum(p.numel() for name, p in model.named_parameters() if ".experts." in name)
    assert experts > 0 and target_parameters(folder, config) == total
    assert active_parameters(folder, config) == total - experts // 2
    assert target_parameters_billion(folder.as_uri()) == pytest.approx((total - experts // 2) / 1e9)
    dense = make_tiny_target(tmp_path / "dense", "qwen3")
    assert active_parameters(dense, json.loads((dense / "config.json").read_text())) == target_parameters(dense, {})
