"""The target contract read from the model (trainer/targets/contract.py) and the self-test at prepare
(trainer/targets/self_test.py), on architectures in no table: tiny random targets built from the pinned
transformers' own config classes (tests/tiny_targets.py UNLISTED_CONFIGS; nothing downloaded). Each layer kind is
read from the cache the model builds, rolled back as that cache allows, and decodes losslessly; a stateful layer
merely cropped fails the self-test naming the layer; prepare records the self-test and refuses a target that fails
it before anything else is spent."""

from __future__ import annotations

import json

import pytest
import torch
from drafters import random_drafter
from test_pipeline import small_run_config
from tiny_targets import UNLISTED_CONFIGS, make_tiny_target

from schemas.sampling import SamplingParams
from trainer.errors import TargetConfigInvalid, TargetSelfTestFailed
from trainer.speculative import SpeculativeDecoder
from trainer.targets import inspect_target_dir, load_target
from trainer.targets.contract import Rollback
from trainer.targets.self_test import run_self_test

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=24)

# What each architecture's layers are and how each kind rolls back, as the contract must read them (6 layers).
EXPECTED = {
    "deepseek_v3": ({"full": 6}, {"full": "crop"}, True),  # multi-head latent attention caches per-token K/V
    "glm4_moe": ({"full": 6}, {"full": "crop"}, True),
    "lfm2": ({"full": 2, "conv": 4}, {"conv": "crop", "full": "crop"}, False),  # a recorded conv state crops
    "nemotron_h": ({"full": 1, "linear": 3, "none": 2}, {"linear": "replay", "full": "crop", "none": "none"}, True),
    "mamba": ({"linear": 6}, {"linear": "replay"}, False),  # no attention layer at all
}


@pytest.fixture(scope="session")
def unlisted_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("unlisted")
    return {arch: make_tiny_target(root / arch, arch) for arch in sorted(UNLISTED_CONFIGS)}


@pytest.fixture(scope="session")
def unlisted(unlisted_dirs):
    return {arch: load_target(folder) for arch, folder in unlisted_dirs.items()}


def test_the_contract_is_read_from_the_model_and_its_cache(unlisted):
    for arch, (kinds, rollback, moe) in EXPECTED.items():
        target = unlisted[arch]
        assert (target.family["layer_kinds"], target.family["rollback_by_kind"]) == (kinds, rollback), arch
        assert target.family["moe"] is moe and target.family["family"] == arch and target.family["engines"] == []
        assert target.rollback is (Rollback.REPLAY if "replay" in rollback.values() else Rollback.CROP)
    # the final norm the LM head reads, whatever the architecture names it (the drafter's last tap)
    assert {arch: t.contract.final_norm for arch, t in unlisted.items()} == {
        "deepseek_v3": "norm", "glm4_moe": "norm", "lfm2": "embedding_norm", "nemotron_h": "norm_f",
        "mamba": "norm_f"}
    assert unlisted["nemotron_h"].family["active_expert_fraction"] == 0.5


def test_each_unlisted_architecture_passes_the_self_test_and_decodes_losslessly(unlisted):
    """An untrained drafter: most drafts are rejected, so nearly every cycle takes the verify back."""
    for arch, target in unlisted.items():
        if arch == "mamba":  # its cached multi-token forward is wrong: see the refusal test below
            continue
        result = run_self_test(target)
        assert result.passed, (arch, result.failure)
        assert result.cycles and result.drafts_rejected and result.seconds < 2.0
        drafter = random_drafter(target, "dflash2", block_size=4, seed=2)
        for prompt in ([7, 9, 11, 13, 5], [40, 41]):
            expected = SpeculativeDecoder(target).generate(prompt, GREEDY, stop_token_ids=[]).tokens
            assert SpeculativeDecoder(target, drafter).generate(prompt, GREEDY, stop_token_ids=[]).tokens == expected


@pytest.mark.parametrize("arch", ["nemotron_h", "mamba"])
def test_a_mamba_state_merely_cropped_fails_the_self_test_naming_the_layer(unlisted, arch):
    """The planted bug: Mamba (Nemotron-H's Mamba-2 layers, Mamba's own) cropped like attention instead of restored
    and replayed."""
    target = unlisted[arch]
    target.rollback = Rollback.CROP
    try:
        result = run_self_test(target)
    finally:
        target.rollback = None
    assert not result.passed and (result.layer, result.layer_kind) == (0, "linear")
    assert "recurrent_states" in result.failure and "(crop)" in result.failure


def test_a_convolution_state_not_cropped_fails_the_self_test(unlisted, monkeypatch):
    """The planted bug for a short convolution (LFM2): its recorded state left as the verify grew it."""
    target = unlisted["lfm2"]
    monkeypatch.setattr("trainer.targets.loading.Target.crop_cache", staticmethod(_crop_attention_only))
    result = run_self_test(target)
    assert not result.passed and result.layer_kind == "conv", result.failure


def _crop_attention_only(cache, length: int) -> None:
    remove = cache.get_seq_length() - length
    for layer in cache.layers:
        if remove > 0 and not hasattr(layer, "conv_states"):
            layer.crop(-remove)


def test_prepare_records_the_self_test_and_refuses_a_target_that_fails_it(unlisted_dirs, tmp_path, monkeypatch):
    from trainer.pipeline import Layout, run_stage

    config = small_run_config(unlisted_dirs["nemotron_h"])
    layout = Layout.under(tmp_path / "ok", tmp_path / "ok" / "out")
    summary = run_stage("prepare", config, layout)
    recorded = json.loads(layout.prepared.read_text())["self_test"]
    assert recorded["passed"] is True and recorded == summary["self_test"]
    assert recorded["layer_kinds"] == EXPECTED["nemotron_h"][0] and recorded["rollback"] == "replay"

    # The same checkpoint with its stateful layers' rollback planted wrong: stopped at prepare, nothing written.
    monkeypatch.setattr("trainer.targets.loading.Target.rollback", property(lambda self: Rollback.CROP))
    refused = Layout.under(tmp_path / "refused", tmp_path / "refused" / "out")
    with pytest.raises(TargetSelfTestFailed, match=r"nemotron_h.*self-test.*layer 0 \(linear"):
        run_stage("prepare", config, refused)
    assert not refused.prepared.exists()


def test_a_model_type_transformers_cannot_build_is_refused_before_loading(unlisted_dirs, tmp_path):
    folder = tmp_path / "t"
    folder.mkdir()
    for file in unlisted_dirs["glm4_moe"].iterdir():
        (folder / file.name).write_bytes(file.read_bytes())
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "not_a_model_type"}))
    with pytest.raises(TargetConfigInvalid, match="does not describe a model transformers can build"):
        inspect_target_dir(folder)


def test_the_self_test_is_cheap_and_seeded(unlisted):
    target = unlisted["glm4_moe"]
    first, again = run_self_test(target, seed=3), run_self_test(target, seed=3)
    assert (first.cycles, first.drafts_rejected) == (again.cycles, again.drafts_rejected)
    assert first.tokens == 12 and first.block_size == 4 and torch.get_default_dtype() == torch.float32


def test_in_bfloat16_a_rounding_tie_is_recorded_not_refused_and_a_planted_crop_still_fails(unlisted_dirs, tmp_path):
    """Outside float32 the reference runs at a verify's width and validation's near-tie rule applies: a first
    difference whose two logits are within the dtype's resolution is recorded as a tie (seed 1 here has one),
    while a stateful layer merely cropped still fails exactly as in float32."""
    llama = load_target(make_tiny_target(tmp_path / "llama", "llama"), dtype=torch.bfloat16)
    tied = run_self_test(llama, seed=1)
    assert tied.passed and tied.near_tie is not None and tied.reference == "every forward 4 tokens wide"
    assert tied.near_tie["logit_gap"] <= 2 * tied.near_tie["resolution"]
    hybrid = load_target(unlisted_dirs["nemotron_h"], dtype=torch.bfloat16)
    assert run_self_test(hybrid).passed
    hybrid.rollback = Rollback.CROP
    planted = run_self_test(hybrid)
    assert not planted.passed and planted.layer_kind == "linear" and planted.near_tie is None


def test_a_gpt2_shaped_target_is_read_from_its_own_names():
    """GPT-2's decoder keeps its layers under `h` and its final norm as `ln_f`, and its config has no grouped-query
    or MLP-width setting: the contract finds both by what they are, the self-test passes, and the drafter's shape
    falls back to one key/value head per head and Qwen3's MLP ratio."""
    import transformers

    from trainer.drafter import DrafterConfig
    from trainer.targets.loading import Target

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_embd=64, n_layer=4, n_head=4, vocab_size=256, n_positions=256)
    target = Target(transformers.GPT2LMHeadModel(config).eval().requires_grad_(False), tokenizer=None)
    target.__dict__["fingerprint"] = "sha256:test"  # no tokenizer to fingerprint here
    assert target.contract.final_norm == "ln_f" and target.num_layers == 4 and target.contract.tied_head
    assert run_self_test(target).passed
    shape = DrafterConfig.for_target(target, mask_token_id=5, num_layers=1, block_size=4)
    assert (shape.num_attention_heads, shape.num_key_value_heads, shape.intermediate_size) == (4, 4, 192)


def test_a_cached_multi_token_forward_that_ignores_the_state_is_refused(tmp_path):
    """transformers' Mamba mixer computes a forward of several tokens over a cache as if the state were empty: with
    weights large enough for the state to matter, a verify's logits stray far from the one-token decode's, and the
    self-test refuses the target before any token could be compared (tiny default weights hide it: their state
    contributes next to nothing)."""
    mamba = load_target(make_tiny_target(tmp_path / "mamba", "mamba", num_layers=2, init_std=0.3))
    result = run_self_test(mamba)
    assert not result.passed and result.logit_drift > 0.5
    assert "a forward of several tokens over the cache does not compute" in result.failure
