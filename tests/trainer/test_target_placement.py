"""Targets larger than one GPU: the placement plan (pure: sizes in, placement out), the loader's device_map path
(exercised on the CPU with a layer split over the CPU and disk, the only two "devices" a CPU machine has), and the
vLLM backend's tensor_parallel_size."""

from __future__ import annotations

import json

import pytest
import torch
from tiny_targets import make_tiny_target

from trainer.data import vllm_backend
from trainer.errors import TargetError
from trainer.targets import loading
from trainer.targets.loading import load_target
from trainer.targets.placement import (
    GIB,
    TargetPlacement,
    estimated_parameters,
    plan_placement,
    target_parameters,
    tensor_parallel_size,
)

H200 = 141 * GIB
EIGHT_H200 = {i: H200 for i in range(8)}


def test_a_target_that_fits_one_gpu_stays_on_it():
    placement = plan_placement(8_000_000_000, torch.bfloat16, EIGHT_H200, first_gpu=3)
    assert placement.gpus == [3] and not placement.split
    assert placement.from_pretrained_options() == {}  # the plain .to(device), as before


def test_a_larger_target_is_split_over_the_fewest_gpus():
    # 70B in bfloat16: 130 GiB of weights; an H200 leaves 105 GiB of weights after the headroom.
    placement = plan_placement(70_000_000_000, torch.bfloat16, EIGHT_H200)
    assert placement.gpus == [0, 1]
    assert placement.from_pretrained_options() == {"device_map": "auto",
                                                   "max_memory": {0: int(H200 * 0.75), 1: int(H200 * 0.75)}}
    # 405B: 755 GiB, eight H200s leave 846 GiB.
    assert plan_placement(405_000_000_000, torch.bfloat16, EIGHT_H200).gpus == list(range(8))
    # From the job's first GPU on.
    assert plan_placement(70_000_000_000, torch.bfloat16, EIGHT_H200, first_gpu=6).gpus == [6, 7]


def test_a_target_that_fits_nowhere_is_refused_naming_the_fix():
    with pytest.raises(TargetError, match=r"needs 1508\.7 GiB .*405\.00B parameters in float32.*"
                                          r"set compute\.dtype to auto"):
        plan_placement(405_000_000_000, torch.float32, EIGHT_H200, name="target big")
    with pytest.raises(TargetError, match="more GPU memory") as refused:
        plan_placement(405_000_000_000, torch.bfloat16, {0: H200, 1: H200})
    assert "compute.dtype" not in str(refused.value)  # bfloat16 already


def test_one_gpu_only_names_the_device_setting():
    # A job pinned to cuda:0 (or a training rank) may not split; the node could hold it split.
    with pytest.raises(TargetError, match="set compute.device to cuda"):
        plan_placement(70_000_000_000, torch.bfloat16, EIGHT_H200, may_split=False)
    assert plan_placement(8_000_000_000, torch.bfloat16, EIGHT_H200, may_split=False).gpus == [0]


def test_vllm_tensor_parallel_size_divides_the_heads():
    def placed(gpus: int) -> TargetPlacement:
        return TargetPlacement(0, list(range(gpus)), {})

    assert tensor_parallel_size(placed(1), 64, 8) == 1
    assert tensor_parallel_size(placed(2), 64, 8) == 2
    assert tensor_parallel_size(placed(3), 64, 8) == 4  # 3 divides neither 64 heads nor 8 KV heads
    assert tensor_parallel_size(placed(5), 40, 8) == 8  # 5 splits the 40 heads but not the 8 KV heads


def test_parameters_from_the_checkpoint(tmp_path):
    path = make_tiny_target(tmp_path / "t")
    exact = sum(p.numel() for p in load_target(path).model.parameters())
    config = json.loads((path / "config.json").read_text())
    assert target_parameters(path, config) == exact
    # The config estimate leaves out Qwen3's per-head q/k norms only.
    assert abs(estimated_parameters(config) - exact) / exact < 0.01


def test_the_cpu_path_plans_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    assert loading.gpu_placement(tmp_path, {}, torch.device("cpu"), torch.float32, None) is None


class _Split:
    """A placement whose split is the CPU and the disk: what a CPU machine can show of a multi-device load."""

    def __init__(self, offload):
        self.offload = offload

    def from_pretrained_options(self) -> dict:
        layers = {f"model.layers.{i}": "cpu" if i < 3 else "disk" for i in range(6)}
        return {"device_map": {"model.embed_tokens": "cpu", **layers, "model.norm": "cpu", "model.rotary_emb": "cpu",
                               "lm_head": "cpu"}, "offload_folder": str(self.offload)}


def test_a_split_target_computes_what_the_whole_one_does(tmp_path, monkeypatch):
    path = make_tiny_target(tmp_path / "t")
    whole = load_target(path)
    monkeypatch.setattr(loading, "gpu_placement", lambda *args: _Split(tmp_path / "offload"))
    # A real split lands on GPUs only; the CPU and disk are refused by name (nothing offloaded silently)...
    with pytest.raises(TargetError, match="went to cpu, disk"):
        load_target(path)
    # ...so that check is set aside here to run the split model itself: taps gathered across its devices.
    monkeypatch.setattr(loading, "_check_all_on_gpus", lambda model, path: None)
    split = load_target(path)
    assert set(split.model.hf_device_map.values()) == {"cpu", "disk"}
    ids = torch.tensor([[5, 9, 11, 40, 7, 2]])
    (logits_a, taps_a), (logits_b, taps_b) = whole.forward(ids, tap_layer_ids=[1, 4, 5]), \
        split.forward(ids, tap_layer_ids=[1, 4, 5])
    assert torch.equal(logits_a, logits_b) and torch.equal(taps_a, taps_b)


def test_the_vllm_driver_gets_the_tensor_parallel_size(tmp_path):
    class FakeTarget:
        path = tmp_path
        config = type("Config", (), {"max_position_embeddings": 2048})()

        @staticmethod
        def stop_token_ids():
            return [2]

    assert vllm_backend.VllmResponses(FakeTarget(), threads=1).driver_config()["tensor_parallel_size"] == 1
    config = vllm_backend.VllmResponses(FakeTarget(), threads=1, tensor_parallel_size=4).driver_config()
    assert config == {"target": str(tmp_path), "dtype": "float32", "max_model_len": 2048, "tensor_parallel_size": 4}
