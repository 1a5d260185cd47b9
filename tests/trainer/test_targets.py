"""Loading targets: supported architectures load, bad directories fail in one line and write nothing."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from tiny_targets import make_tiny_target, make_tokenizer

from trainer.errors import TargetError
from trainer.targets import load_target
from trainer.targets.chat import choose_mask_token_id, render_prompt


@pytest.fixture(scope="module")
def good_dir(tmp_path_factory):
    return make_tiny_target(tmp_path_factory.mktemp("good"), "qwen3")


def snapshot(path):
    return sorted((p.relative_to(path), p.stat().st_size) for p in path.rglob("*"))


def broken_copy(good_dir, tmp_path, mutate):
    target = tmp_path / "target"
    shutil.copytree(good_dir, target)
    mutate(target)
    return target


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda d: (d / "config.json").unlink(), "config.json is missing"),
    (lambda d: (d / "tokenizer.json").unlink(), "tokenizer files are missing"),
    (lambda d: (d / "model.safetensors").unlink(), "no weights found"),
    (lambda d: (d / "model.safetensors").rename(d / "pytorch_model.bin"), "only pickle weights"),
    (lambda d: (d / "config.json").write_text(json.dumps({**json.loads((d / "config.json").read_text()),
                                                         "model_type": "mamba", "architectures": ["MambaForCausalLM"]})),
     "does not describe a model transformers can build"),  # no list of families: transformers' own refusal
    (lambda d: (d / "config.json").write_text("{not json"), "config.json is not valid JSON"),
])
def test_bad_target_directories_fail_in_one_line(good_dir, tmp_path, mutate, message):
    target = broken_copy(good_dir, tmp_path, mutate)
    before = snapshot(tmp_path)
    with pytest.raises(TargetError) as error:
        load_target(target)
    assert message in str(error.value)
    assert "\n" not in str(error.value)
    assert snapshot(tmp_path) == before  # nothing written


def test_not_a_directory(tmp_path):
    with pytest.raises(TargetError, match="not a directory"):
        load_target(tmp_path / "nowhere")


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
@pytest.mark.parametrize("tie", [False, True])
def test_supported_architectures_expose_what_a_drafter_needs(tmp_path, arch, tie):
    target = load_target(make_tiny_target(tmp_path, arch, tie=tie, num_layers=5))
    assert target.dtype == torch.float32
    assert (target.hidden_size, target.vocab_size, target.num_layers) == (64, 256, 5)
    ids = torch.tensor([[5, 9, 13, 21]])
    assert torch.equal(target.embed(ids), target.model.get_input_embeddings()(ids))
    logits, taps = target.forward(ids, tap_layer_ids=[3, 0])
    reference = target.model(ids, output_hidden_states=True)
    torch.testing.assert_close(logits, reference.logits)
    # Taps are HF hidden_states[id + 1], concatenated in the order asked for.
    torch.testing.assert_close(taps, torch.cat([reference.hidden_states[4], reference.hidden_states[1]], dim=-1))
    torch.testing.assert_close(target.lm_head(reference.hidden_states[-1]), reference.logits)
    # The last layer's entry in HF's hidden_states is post-norm (what the LM head reads): tapped the same way.
    _, last = target.forward(ids, tap_layer_ids=[4])
    torch.testing.assert_close(last, reference.hidden_states[5])
    with pytest.raises(TargetError, match="out of range"):
        target.forward(ids, tap_layer_ids=[5])


def test_cache_rolls_back(tiny_qwen3):
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    full, _ = tiny_qwen3.forward(ids)
    cache = tiny_qwen3.new_cache()
    tiny_qwen3.forward(torch.tensor([[5, 6, 7, 99, 98]]), cache=cache)
    tiny_qwen3.crop_cache(cache, 3)  # reject the last two tokens
    tail, _ = tiny_qwen3.forward(ids[:, 3:], position_ids=torch.arange(3, 6)[None], cache=cache)
    torch.testing.assert_close(tail, full[:, 3:], rtol=1e-5, atol=1e-5)


def test_fingerprint_depends_on_embedding_and_vocab(tmp_path):
    a = load_target(make_tiny_target(tmp_path / "a", seed=0))
    b = load_target(make_tiny_target(tmp_path / "b", seed=0))
    c = load_target(make_tiny_target(tmp_path / "c", seed=1))
    assert a.fingerprint == b.fingerprint != c.fingerprint
    assert a.fingerprint.startswith("sha256:")


def test_mask_token_rule(tmp_path):
    with_mask = make_tokenizer(64, with_mask=True)
    assert choose_mask_token_id(with_mask, 64) == (with_mask.mask_token_id, "the tokenizer's mask token")
    plain = make_tokenizer(64)
    assert choose_mask_token_id(plain, 80)[0] == 64  # padded embedding: first row beyond the tokenizer
    token_id, reason = choose_mask_token_id(plain, 64)
    assert plain.convert_ids_to_tokens(token_id) == "<reserved>" and "unused special token" in reason


def test_render_prompt_uses_chat_template(tiny_qwen3):
    ids = render_prompt(tiny_qwen3.tokenizer, [{"role": "user", "content": "w1 w2"}])
    text = tiny_qwen3.tokenizer.decode(ids)
    assert text.startswith("<|im_start|>") and text.rstrip().endswith("assistant")


@pytest.mark.slow
def test_bundled_smollm2_is_a_plain_hf_directory(smollm2_dir, smollm2):
    names = {p.name for p in smollm2_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= names
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config
    assert (smollm2.num_layers, smollm2.hidden_size, smollm2.vocab_size) == (30, 576, 49152)
    assert smollm2.stop_token_ids() == [smollm2.tokenizer.convert_tokens_to_ids("<|im_end|>")]
    prompt = render_prompt(smollm2.tokenizer, [{"role": "user", "content": "What is the capital of France?"}])
    out = smollm2.model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)
    assert "Paris" in smollm2.tokenizer.decode(out[0, len(prompt):])
