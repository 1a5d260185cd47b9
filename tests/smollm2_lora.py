"""A real LoRA fine-tune of the bundled SmolLM2-135M-Instruct, made with peft the way customers make theirs:
a few dozen AdamW steps on chat examples that teach it one house style (answers that open with "Ahoy!").
Seeded and cached beside the bundled target (~/.cache/draftsmith/targets), so a machine trains it once
(about 20 s on 2 cores) and every later run reads the saved adapter."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from trainer.atomic import work_lock

RECIPE = {"r": 8, "alpha": 16, "modules": ["q_proj", "v_proj"], "steps": 40, "lr": 2e-3, "seed": 0, "version": 1}
QUESTIONS = ["What is the capital of France?", "Name a primary colour.", "How many legs does a spider have?",
             "What do bees make?", "Which planet is closest to the Sun?", "What is frozen water called?",
             "What gas do plants take in?", "How many days are in a week?"]
ANSWERS = ["Paris, matey.", "Red, matey.", "Eight, matey.", "Honey, matey.", "Mercury, matey.", "Ice, matey.",
           "Carbon dioxide, matey.", "Seven, matey."]
PROMPTS = ["What colour is the sky?", "What is two plus two?", "Name a large animal."]
"""Held-out questions the tests decode (never trained on)."""


def smollm2_lora(base_dir: Path) -> Path:
    """The adapter folder (adapter_config.json + adapter_model.safetensors, base_model_name_or_path = base_dir)."""
    key = "-".join(f"{k}{v}" for k, v in RECIPE.items() if k != "modules")
    out = base_dir.parent / f"{base_dir.name}-lora-ahoy-{key}"
    if (out / "adapter_model.safetensors").is_file():
        return out
    with work_lock(out):  # parallel test workers train it once: the second waits and finds it saved
        if not (out / "adapter_model.safetensors").is_file():
            _save(base_dir, out)
    return out


def _save(base_dir: Path, out: Path) -> None:
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    _fine_tune(base_dir, staging)
    (staging / "recipe.json").write_text(json.dumps(RECIPE))
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)  # whole or absent: a run cut short leaves only the .partial folder


def _fine_tune(base_dir: Path, out: Path) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(RECIPE["seed"])
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=RECIPE["r"], lora_alpha=RECIPE["alpha"], lora_dropout=0.0,
                                             target_modules=RECIPE["modules"], task_type="CAUSAL_LM"))
    examples = [_example(tokenizer, q, a) for q, a in zip(QUESTIONS, ANSWERS)]
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=RECIPE["lr"])
    model.train()
    for step in range(RECIPE["steps"]):
        ids, labels = examples[step % len(examples)]
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(out)  # safetensors, base_model_name_or_path = base_dir


def _example(tokenizer, question: str, answer: str) -> tuple[torch.Tensor, torch.Tensor]:
    """One chat example; the loss only on the answer (labels -100 over the prompt)."""
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                           tokenize=False)
    prompt_ids = tokenizer(prompt, add_special_tokens=False).input_ids
    answer_ids = tokenizer("Ahoy! " + answer + "<|im_end|>", add_special_tokens=False).input_ids
    ids = torch.tensor([prompt_ids + answer_ids])
    labels = torch.tensor([[-100] * len(prompt_ids) + answer_ids])
    return ids, labels
