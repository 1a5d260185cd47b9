"""The adapter path on a real fine-tune: a LoRA of the bundled SmolLM2 trained with peft (tests/smollm2_lora.py).
Loaded as a target it says what peft's own merged model says, token for token, and not what the base says; a
drafter over it decodes losslessly."""

from __future__ import annotations

import pytest
import torch
from drafters import random_drafter
from smollm2_lora import PROMPTS, smollm2_lora

from schemas.sampling import SamplingParams
from trainer.speculative import SpeculativeDecoder
from trainer.targets import load_target

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=16)


@pytest.fixture(scope="module")
def lora_dir(smollm2_dir):
    return smollm2_lora(smollm2_dir)


@pytest.fixture(scope="module")
def lora_target(lora_dir, smollm2_dir):
    return load_target(lora_dir, base=smollm2_dir)


def rendered(target, question: str) -> list[int]:
    text = target.tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                                tokenize=False)
    return target.tokenizer(text, add_special_tokens=False).input_ids


@torch.inference_mode()
def peft_greedy(base_dir, adapter_dir, prompts: list[list[int]], count: int) -> list[list[int]]:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, adapter_dir).merge_and_unload().eval()
    outputs = []
    for prompt in prompts:
        ids = list(prompt)
        for _ in range(count):
            ids.append(int(merged(torch.tensor([ids])).logits[0, -1].argmax()))
        outputs.append(ids[len(prompt):])
    return outputs


def test_the_fine_tune_is_peft_s_merge_and_not_its_base(smollm2_dir, smollm2, lora_dir, lora_target):
    assert (lora_target.path, lora_target.adapter_path) == (smollm2_dir, lora_dir)
    assert lora_target.fingerprint != smollm2.fingerprint
    prompts = [rendered(lora_target, q) for q in PROMPTS]
    expected = peft_greedy(smollm2_dir, lora_dir, prompts, GREEDY.max_new_tokens)
    alone, base_alone = SpeculativeDecoder(lora_target), SpeculativeDecoder(smollm2)
    got = [alone.generate(p, GREEDY, stop_token_ids=[]).tokens for p in prompts]
    assert got == expected
    # The fine-tune learned its house style; the base never opens an answer that way.
    assert all(lora_target.tokenizer.decode(tokens).startswith("Ahoy") for tokens in got)
    base = [base_alone.generate(p, GREEDY, stop_token_ids=[]).tokens for p in prompts]
    assert not any(smollm2.tokenizer.decode(tokens).startswith("Ahoy") for tokens in base)


def test_a_drafter_over_the_fine_tune_decodes_losslessly(lora_target):
    drafter = random_drafter(lora_target, "dflash2", block_size=8, seed=0)
    speculative, alone = SpeculativeDecoder(lora_target, drafter), SpeculativeDecoder(lora_target)
    for question in PROMPTS:
        prompt = rendered(lora_target, question)
        assert (speculative.generate(prompt, GREEDY, stop_token_ids=[]).tokens
                == alone.generate(prompt, GREEDY, stop_token_ids=[]).tokens)
