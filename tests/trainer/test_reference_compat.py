"""A drafter saved by Draftsmith is a reference `dflash` checkpoint: the reference classes load it, compute
the same hidden states, and their `dflash_generate` gives the same tokens and acceptance lengths."""

from __future__ import annotations

import json

import pytest
import torch
from drafters import random_drafter
from safetensors import safe_open

from schemas.sampling import SamplingParams
from trainer.drafter.checkpoint import load_drafter, save_drafter
from trainer.drafter.model import DrafterCache
from trainer.speculative import SpeculativeDecoder
from trainer.targets.chat import render_prompt

REFERENCE_CLASSES = {"dflash": "DFlashDraftModel", "dflash2": "DFlash2DraftModel"}


def load_reference(reference_dflash, variant, path):
    return getattr(reference_dflash, REFERENCE_CLASSES[variant]).from_pretrained(path, dtype=torch.float32).eval()


@pytest.mark.parametrize("variant", ["dflash", "dflash2"])
def test_checkpoint_format(tiny_qwen3, variant, tmp_path):
    drafter = random_drafter(tiny_qwen3, variant)
    save_drafter(drafter, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == [REFERENCE_CLASSES[variant]]
    expected_keys = {"block_size", "mask_token_id", "target_layer_ids"}
    if variant == "dflash2":
        expected_keys |= {"conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"}
    assert set(config["dflash_config"]) == expected_keys
    assert config["num_target_layers"] == tiny_qwen3.num_layers
    with safe_open(tmp_path / "model.safetensors", "pt") as weights:
        names = set(weights.keys())
    if variant == "dflash2":
        # The released spelling: codebooks without the `.weight` suffix.
        assert {"candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook"} <= names
        assert not any(name.endswith("codebook.weight") for name in names)
    reloaded = load_drafter(tmp_path)
    for (name, a), b in zip(drafter.state_dict().items(), reloaded.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("variant,num_layers", [("dflash", 2), ("dflash2", 2), ("dflash", 3), ("dflash2", 3)])
def test_reference_loads_and_computes_same_hidden_states(tiny_qwen3, variant, num_layers, tmp_path,
                                                         reference_dflash):
    drafter = random_drafter(tiny_qwen3, variant, block_size=8, num_layers=num_layers)
    save_drafter(drafter, tmp_path)
    reference = load_reference(reference_dflash, variant, tmp_path)
    assert reference.target_layer_ids == list(drafter.config.target_layer_ids)
    assert reference.mask_token_id == drafter.config.mask_token_id
    ours = {k: v for k, v in drafter.state_dict().items()}
    theirs = reference.state_dict()
    assert set(ours) <= set(theirs)
    for name, tensor in ours.items():
        assert torch.equal(tensor, theirs[name]), name

    torch.manual_seed(0)
    context = torch.randn(1, 11, len(drafter.config.target_layer_ids) * drafter.config.hidden_size)
    block_ids = torch.tensor([[9] + [drafter.config.mask_token_id] * 7])
    noise = tiny_qwen3.embed(block_ids)
    positions = torch.arange(11, 19)[None]
    with torch.no_grad():
        ours_hidden = drafter(noise, positions, context, torch.arange(11)[None], cache=DrafterCache(num_layers))
        theirs_hidden = reference(target_hidden=context, noise_embedding=noise,
                                  position_ids=torch.arange(19)[None])
    torch.testing.assert_close(ours_hidden, theirs_hidden, rtol=1e-5, atol=1e-5)
    if variant == "dflash2":
        logits = tiny_qwen3.lm_head(ours_hidden[:, 1:])
        ours_path = drafter.propose(ours_hidden[:, 1:], logits, block_ids[:, 0], 0.0)[0]
        theirs_path = reference.propose(theirs_hidden[:, 1:], block_ids[:, 0], tiny_qwen3.lm_head, 0.0)[0]
        assert torch.equal(ours_path, theirs_path)


def _compare_with_reference(target, drafter, reference, reference_dflash, prompts, max_new_tokens):
    decoder = SpeculativeDecoder(target, drafter)
    params = SamplingParams(max_new_tokens=max_new_tokens)
    for prompt in prompts:
        ours = decoder.generate(prompt, params)
        theirs = reference_dflash.dflash_generate(
            reference, target.model, torch.tensor([prompt]), max_new_tokens, target.stop_token_ids(),
            return_stats=True,
        )
        assert ours.tokens == theirs.output_ids[0, len(prompt):].tolist()
        assert ours.acceptance_lengths == theirs.acceptance_lengths


@pytest.mark.parametrize("variant", ["dflash", "dflash2"])
def test_same_tokens_and_acceptance_as_reference_generate(tiny_qwen3, variant, tmp_path, reference_dflash):
    drafter = random_drafter(tiny_qwen3, variant, block_size=4)
    save_drafter(drafter, tmp_path)
    reference = load_reference(reference_dflash, variant, tmp_path)
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(6, tiny_qwen3.vocab_size, (n,), generator=generator).tolist() for n in (3, 9, 17)]
    _compare_with_reference(tiny_qwen3, drafter, reference, reference_dflash, prompts, 30)


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["dflash", "dflash2"])
def test_same_tokens_and_acceptance_as_reference_on_smollm2(smollm2, variant, tmp_path, reference_dflash):
    drafter = random_drafter(smollm2, variant, block_size=8, num_layers=1, scale=0.02)
    save_drafter(drafter, tmp_path)
    reference = load_reference(reference_dflash, variant, tmp_path)
    prompt = render_prompt(smollm2.tokenizer, [{"role": "user", "content": "Say hello in French."}])
    _compare_with_reference(smollm2, drafter, reference, reference_dflash, [prompt], 16)
