"""vLLM as the generate stage's response backend (trainer/data/vllm_backend.py) on the real SmolLM2-135M-Instruct:
the data set it leads to has the built-in loop's form, and greedy, float32 on both sides, its responses are the
built-in loop's.

Skipped, with the reason, when vLLM is not installed (bench/setup/vllm_cpu.sh). One vLLM engine is started
(about a minute on 2 cores) and a handful of short prompts regenerated with each backend.
"""

from __future__ import annotations

import pytest
import torch

from schemas.sampling import SamplingParams
from trainer.data.prompts import Prompt, draw_prompts
from trainer.data.regenerate import regenerate
from trainer.pipeline import response_backend
from trainer.validation import engine_paths

pytestmark = pytest.mark.slow
MAX_NEW_TOKENS = 40
TAPS = [1, 15, 28]
TOP_K = 8
# Short answers, so some responses end on the stop token (kept as their last token, as the built-in loop keeps it).
SHORT = ["Reply with one word: is the sky blue?", "What is 2 + 2? Answer with the number only."]


def test_vllm_backend_regenerates_the_builtin_loops_data(smollm2, tmp_path):
    if engine_paths.vllm_python() is None:
        pytest.skip(engine_paths.missing("vllm"))
    prompts = draw_prompts("builtin", 4, 0) + [Prompt(f"short{i}", "short", ({"role": "user", "content": text},))
                                              for i, text in enumerate(SHORT)]
    params = SamplingParams(max_new_tokens=MAX_NEW_TOKENS)
    kwargs = dict(tap_layer_ids=TAPS, teacher_top_k=TOP_K, batch_size=8)
    builtin = regenerate(smollm2, prompts, params, tmp_path / "builtin", **kwargs).examples()
    with response_backend("vllm", smollm2) as backend:
        served = regenerate(smollm2, prompts, params, tmp_path / "vllm", backend=backend, **kwargs).examples()
        assert backend.tokens == sum(len(e.input_ids) - e.prompt_len for e in served) and backend.seconds > 0

    stop = set(smollm2.stop_token_ids())
    hidden = smollm2.hidden_size
    for example in served:  # the built-in loop's form, whoever wrote the response
        response = example.input_ids[example.prompt_len:]
        assert example.hidden.dtype == torch.bfloat16
        assert example.hidden.shape == (len(example.input_ids) - 1, len(TAPS) * hidden)
        assert example.teacher.ids.shape == (len(response), TOP_K) and example.teacher.ids.dtype == torch.int32
        assert example.teacher.final_hidden.shape == (len(response), hidden)
        assert (example.stop_reason == "stop") == (response[-1] in stop)
        assert example.stop_reason == "stop" or len(response) == MAX_NEW_TOKENS
        # Greedy: the target's own argmax at every step is the token vLLM chose.
        assert example.teacher.ids[:, 0].tolist() == response
    assert any(e.stop_reason == "stop" for e in served)

    identical = [a.input_ids == b.input_ids and a.stop_reason == b.stop_reason for a, b in zip(builtin, served)]
    print(f"greedy responses identical on {sum(identical)} of {len(identical)} prompts")
    assert all(identical), [(a.id, a.input_ids[a.prompt_len:], b.input_ids[b.prompt_len:])
                            for a, b, same in zip(builtin, served, identical) if not same]
    for a, b in zip(builtin, served):  # same tokens: the teacher-forced capture equals the fused one
        torch.testing.assert_close(b.hidden.float(), a.hidden.float(), rtol=2**-6, atol=2e-2)
        torch.testing.assert_close(b.teacher.logits, a.teacher.logits, rtol=1e-3, atol=1e-3)
        torch.testing.assert_close(b.teacher.final_hidden.float(), a.teacher.final_hidden.float(), rtol=2**-6,
                                   atol=2e-2)


def test_vllm_serves_a_lora_fine_tune_unmerged_with_the_merged_target_s_tokens(smollm2_dir, tmp_path):
    """A fine-tune handed over as a peft adapter: vLLM loads the base and applies the adapter per request (its LoRA
    support); our target merges it. Greedy, float32 on both sides, the responses are the same tokens."""
    from smollm2_lora import PROMPTS, smollm2_lora

    from trainer.targets import load_target

    if engine_paths.vllm_python() is None:
        pytest.skip(engine_paths.missing("vllm"))
    target = load_target(smollm2_lora(smollm2_dir))
    prompts = [Prompt(f"lora{i}", "lora", ({"role": "user", "content": text},)) for i, text in enumerate(PROMPTS)]
    params = SamplingParams(temperature=0.0, max_new_tokens=24)
    kwargs = dict(tap_layer_ids=TAPS, teacher_top_k=TOP_K, batch_size=8)
    builtin = regenerate(target, prompts, params, tmp_path / "builtin", **kwargs).examples()
    with response_backend("vllm", target) as backend:
        served = regenerate(target, prompts, params, tmp_path / "vllm", backend=backend, **kwargs).examples()
    assert [e.input_ids for e in served] == [e.input_ids for e in builtin]
    assert all(target.tokenizer.decode(e.input_ids[e.prompt_len:]).startswith("Ahoy") for e in served)  # the adapter's
