"""The regeneration loop waits for the GPU once per decode step, whatever the batch size.

On the CPU nothing waits, so the test counts the calls that make a CUDA host wait for the device (a value read to
Python, a copy to the host, an output whose size depends on the data) made by the loop itself, outside the target's
forward (trainer/targets/, counted there by its own owners)."""

from __future__ import annotations

import json

import pytest
import torch
from torch.overrides import TorchFunctionMode

from schemas.sampling import SamplingParams
from trainer.data.capture import capture_batch
from trainer.data.prompts import load_prompts
from trainer.data.regenerate import generate_batch, tokenize_prompts


def write_prompts(path, n):
    lines = [json.dumps({"id": f"p{i}", "category": f"c{i % 2}", "prompt": " ".join(f"w{(i * 7 + j * 3) % 200}"
                                                                                   for j in range(6 + i % 5))})
             for i in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return path

SYNCING = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__int__,
           torch.Tensor.__float__, torch.Tensor.__index__, torch.Tensor.cpu, torch.Tensor.numpy,
           torch.Tensor.nonzero, torch.nonzero, torch.Tensor.masked_select, torch.masked_select, torch.unique,
           torch.Tensor.unique}


class HostSyncs(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.count, self.paused = 0, False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.paused:
            to_host = func is torch.Tensor.to and any(str(a) == "cpu" for a in (*args[1:], *kwargs.values()))
            boolean_index = func is torch.Tensor.__getitem__ and isinstance(args[1], torch.Tensor) \
                and args[1].dtype == torch.bool
            self.count += func in SYNCING or to_host or boolean_index
        return func(*args, **kwargs)


@pytest.fixture
def counted(tiny_qwen3, monkeypatch):
    mode = HostSyncs()
    forward = tiny_qwen3.forward

    def unwatched(*args, **kwargs):
        mode.paused = True
        try:
            return forward(*args, **kwargs)
        finally:
            mode.paused = False

    monkeypatch.setattr(tiny_qwen3, "forward", unwatched)
    return mode


def test_the_counter_sees_a_sync():
    with HostSyncs() as mode:
        int(torch.tensor(3))
        torch.arange(4)[torch.arange(4) > 1]
        torch.ones(2).tolist()
    assert mode.count == 3


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_one_host_sync_per_decode_step(tiny_qwen3, counted, tmp_path, temperature):
    prompts = load_prompts(write_prompts(tmp_path / "p.jsonl", n=8))
    params = SamplingParams(max_new_tokens=10, temperature=temperature)
    prompt_ids = tokenize_prompts(tiny_qwen3, prompts, params)
    generator = torch.Generator().manual_seed(0) if temperature else None
    with counted:
        outputs = generate_batch(tiny_qwen3, prompt_ids, params, [1, 3], generator)
    steps = max(len(response) for response, *_ in outputs)
    assert counted.count == steps  # 8 rows; it was about two per row per step


def test_capture_copies_the_teacher_signal_once_per_batch(tiny_qwen3, counted, tmp_path):
    prompts = load_prompts(write_prompts(tmp_path / "p.jsonl", n=6))
    params = SamplingParams(max_new_tokens=8)
    prompt_ids = tokenize_prompts(tiny_qwen3, prompts, params)
    responses = [(response, reason) for response, _, reason, _ in generate_batch(tiny_qwen3, prompt_ids, params, [1])]
    with counted:
        outputs = capture_batch(tiny_qwen3, prompt_ids, responses, [1, 3], teacher_top_k=4)
    assert counted.count == 3  # ids, logits, final hidden: one copy each for the batch
    for (response, _), (_, _, _, teacher) in zip(responses, outputs, strict=True):
        assert teacher.ids.shape == (len(response), 4) and teacher.ids[:, 0].tolist() == response
        assert teacher.ids.untyped_storage().nbytes() == teacher.ids.numel() * 4  # its own storage
