"""Targets handed over as PEFT LoRA adapters over a base model: merged exactly as peft merges them, decoded
losslessly, fingerprinted apart from their base and from each other, refused in one line when incomplete."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch
from click.testing import CliRunner
from drafters import random_drafter
from tiny_targets import make_bpe_target, make_tiny_target, make_tokenizer

import trainer.pipeline
from schemas.job_spec import JobSpec
from schemas.sampling import SamplingParams
from trainer.errors import TargetError
from trainer.speculative import SpeculativeDecoder
from trainer.targets import inspect_target_dir, load_target

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=24)
PROMPTS = [[5, 9, 13, 21], [40, 41, 7], [100, 3 + 5, 77, 78, 79, 80]]


def make_adapter(base_dir, out_dir, *, seed: int, modules=("q_proj", "v_proj")):
    """A LoRA adapter over `base_dir`, saved as peft saves one (safetensors); lora_B randomised (peft starts it at
    zero, which would leave the output the base's)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    torch.manual_seed(seed)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=list(modules)))
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, 0.5)
    peft_model.save_pretrained(out_dir)  # records base_model_name_or_path = base_dir, a local folder
    return out_dir


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    return make_tiny_target(tmp_path_factory.mktemp("base"), "qwen3")


@pytest.fixture(scope="module")
def adapter_a(base_dir, tmp_path_factory):
    return make_adapter(base_dir, tmp_path_factory.mktemp("adapter-a"), seed=1)


@pytest.fixture(scope="module")
def adapter_b(base_dir, tmp_path_factory):
    return make_adapter(base_dir, tmp_path_factory.mktemp("adapter-b"), seed=2)


def peft_merged(base_dir, adapter_dir):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    return PeftModel.from_pretrained(model, adapter_dir).merge_and_unload().eval()


@torch.inference_mode()
def greedy_reference(model, prompt: list[int], count: int) -> list[int]:
    ids = list(prompt)
    for _ in range(count):
        ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


def moved_adapter(adapter_dir, tmp_path, mutate=None):
    """A copy of the adapter whose base_model_name_or_path names a Hub id (what an adapter from the Hub says)."""
    copy = tmp_path / "adapter"
    shutil.copytree(adapter_dir, copy)
    config = json.loads((copy / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = "acme/base-model"
    (copy / "adapter_config.json").write_text(json.dumps(mutate(config) if mutate else config))
    return copy


def test_the_loaded_adapter_is_peft_s_own_merge_token_for_token(base_dir, adapter_a):
    target = load_target(adapter_a, base=base_dir)
    assert (target.path, target.adapter_path) == (base_dir, adapter_a)
    reference, base = peft_merged(base_dir, adapter_a), load_target(base_dir)
    alone, base_alone = SpeculativeDecoder(target), SpeculativeDecoder(base)
    differs = 0
    for prompt in PROMPTS:
        got = alone.generate(prompt, GREEDY, stop_token_ids=[]).tokens
        assert got == greedy_reference(reference, prompt, GREEDY.max_new_tokens)
        differs += got != base_alone.generate(prompt, GREEDY, stop_token_ids=[]).tokens
    assert differs > 0  # the adapter changes what the target says


@pytest.mark.parametrize(("variant", "block_size"), [("dflash2", 8), ("dflash", 4)])
def test_greedy_speculative_output_over_an_adapter_is_the_targets_own(base_dir, adapter_a, variant, block_size):
    target = load_target(adapter_a, base=base_dir)
    assert target.path == base_dir
    drafter = random_drafter(target, variant, block_size=block_size, seed=block_size)
    speculative, alone = SpeculativeDecoder(target, drafter), SpeculativeDecoder(target)
    for prompt in PROMPTS:
        assert (speculative.generate(prompt, GREEDY, stop_token_ids=[]).tokens
                == alone.generate(prompt, GREEDY, stop_token_ids=[]).tokens)


def test_the_fingerprint_tells_adapters_and_their_base_apart(base_dir, adapter_a, adapter_b, tmp_path):
    with_a, with_b, base = (load_target(adapter_a, base=base_dir).fingerprint,
                            load_target(adapter_b, base=base_dir).fingerprint, load_target(base_dir).fingerprint)
    assert len({with_a, with_b, base}) == 3
    # Where the base lay when the adapter was saved is not what the adapter does: the same adapter, saved naming
    # another base location, fingerprints alike over the same base.
    assert load_target(moved_adapter(adapter_a, tmp_path), base=base_dir).fingerprint == with_a


def test_an_adapter_without_a_base_is_refused_naming_target_base(adapter_a, tmp_path):
    adapter = moved_adapter(adapter_a, tmp_path)
    before = sorted(p.name for p in adapter.iterdir())
    for attempt in (inspect_target_dir, load_target):
        with pytest.raises(TargetError) as error:
            attempt(adapter)
        message = str(error.value)
        assert error.value.code == "target_base_required" and "set target.base" in message
        assert "acme" not in message and "\n" not in message
    assert sorted(p.name for p in adapter.iterdir()) == before  # nothing written, nothing fetched


def test_a_base_for_a_full_model_is_refused(base_dir, tmp_path):
    with pytest.raises(TargetError, match="not a LoRA adapter folder"):
        load_target(base_dir, base=base_dir)


def test_a_pickle_only_adapter_is_refused_unless_pickle_is_allowed(base_dir, adapter_a, tmp_path):
    from safetensors.torch import load_file

    adapter = tmp_path / "adapter"
    shutil.copytree(adapter_a, adapter)
    torch.save(load_file(adapter / "adapter_model.safetensors"), adapter / "adapter_model.bin")
    (adapter / "adapter_model.safetensors").unlink()
    with pytest.raises(TargetError) as error:
        load_target(adapter, base=base_dir)
    assert "only pickle weights (adapter_model.bin)" in str(error.value) and "allow_pickle" in str(error.value)
    assert inspect_target_dir(adapter, base=base_dir, allow_pickle=True)["model_type"] == "qwen3"
    (adapter / "adapter_model.bin").unlink()
    with pytest.raises(TargetError, match="no adapter weights found"):
        inspect_target_dir(adapter, base=base_dir)


def test_an_adapter_of_another_kind_is_refused_naming_it(base_dir, adapter_a, tmp_path):
    adapter = moved_adapter(adapter_a, tmp_path, lambda config: {**config, "peft_type": "IA3"})
    with pytest.raises(TargetError, match="PEFT adapter type 'IA3' is not supported"):
        load_target(adapter, base=base_dir)


def test_the_adapter_s_own_tokenizer_is_the_target_s_when_it_has_the_base_s_vocabulary(base_dir, adapter_a, tmp_path):
    adapter = tmp_path / "adapter"
    shutil.copytree(adapter_a, adapter)
    tokenizer = make_tokenizer(256)
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"  # the fine-tune's template
    tokenizer.save_pretrained(adapter)
    assert load_target(adapter, base=base_dir).tokenizer.chat_template == tokenizer.chat_template
    make_tokenizer(256, with_mask=True).save_pretrained(adapter)  # one more special token: another vocabulary
    with pytest.raises(TargetError, match="another vocabulary than its base's"):
        load_target(adapter, base=base_dir)


def test_target_base_is_validated_and_judged_by_the_storage_scope():
    from domain.storage_scope import spec_storage_uris

    spec = JobSpec.model_validate({"target": {"uri": "hf://acme/support-lora@v1",
                                              "base": "hf://acme/base-model@main"}})
    assert [(u.field, u.uri) for u in spec_storage_uris(spec)][:2] == [
        ("target.uri", "hf://acme/support-lora@v1"), ("target.base", "hf://acme/base-model@main")]
    assert "target.base" not in [u.field for u in spec_storage_uris(JobSpec.model_validate(
        {"target": {"uri": "hf://acme/support-lora@v1"}}))]
    for bad in ("ftp://acme/base", "file:///etc/base", " hf://acme/base"):  # file:// outside the allowed roots
        with pytest.raises(ValueError) as error:
            JobSpec.model_validate({"target": {"uri": "bundled:smollm2-135m", "base": bad}})
        assert ("target", "base") in [tuple(e["loc"]) for e in error.value.errors()]


def test_draftsmith_run_takes_the_base(monkeypatch, base_dir, adapter_a, tmp_path):
    from draftsmith.cli import main as cli

    seen = {}
    monkeypatch.setattr(trainer.pipeline.Run, "execute", lambda self, resume=False: seen.setdefault("config", self.config)
                        and (_ for _ in ()).throw(SystemExit(0)))
    CliRunner().invoke(cli, ["run", "--target", str(adapter_a), "--base", str(base_dir), "--out", str(tmp_path / "o")])
    assert (seen["config"].target, seen["config"].base) == (str(adapter_a.resolve()), str(base_dir.resolve()))


def test_a_run_over_an_adapter_is_lossless_and_its_card_names_both(tmp_path):
    from test_pipeline import small_run_config

    from trainer.pipeline import Run

    base = make_bpe_target(tmp_path / "base", num_layers=6)
    adapter = make_adapter(base, tmp_path / "adapter", seed=3)
    moved = moved_adapter(adapter, tmp_path / "hub")  # names a Hub id: the base is given explicitly
    out = tmp_path / "out"
    config = small_run_config(moved)
    Run(dataclasses.replace(config, base=str(base)), out, lambda *_: None).execute()
    report = json.loads((out / "report.json").read_text())
    assert report["lossless"]["greedy"]["mismatches"] == 0 and report["lossless"]["greedy"]["tokens"] > 0
    assert report["target_fingerprint"] == load_target(moved, base=base).fingerprint != load_target(base).fingerprint
    named = report["target"]
    assert (named["adapter"], named["name"], named["base"]) == (True, str(moved), str(base))
    card = (out / "README.md").read_text()
    assert f"the LoRA adapter `{moved}` over the base model `{base}`" in card
    prepared = json.loads((out / ".work" / "prepare.json").read_text())
    assert (prepared["target_path"], prepared["adapter_path"]) == (str(base), str(moved))


def test_vllm_generation_serves_the_adapter_unmerged_and_the_engine_step_skips_it(base_dir, adapter_a, tmp_path):
    """vLLM's generate backend loads the base and applies the adapter (its LoRA support; tests/engines/ compares
    its tokens). The engine step's engines would load the target's folder, the base's, and run it without."""
    from trainer.data.vllm_backend import VllmResponses
    from trainer.validation.engines import ADAPTER_SKIP, run_engines

    target = load_target(adapter_a, base=base_dir)
    config = VllmResponses(target).driver_config()
    assert config["target"] == str(base_dir) and config["lora"] == {"path": str(adapter_a), "max_rank": 8}  # r=4
    assert "lora" not in VllmResponses(load_target(base_dir)).driver_config()
    section = run_engines(target, tmp_path / "no-drafter", [[5]], [[6]], work_dir=tmp_path, engines=("llama.cpp",))
    assert (section["skipped"], section["rows"]) == ([ADAPTER_SKIP], [])
