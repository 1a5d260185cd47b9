"""Where a target's weights go on a GPU node: one GPU, its layers split over several GPUs (transformers'
`device_map="auto"` with a `max_memory` per GPU), or nowhere, refused in one line naming what to change.

`plan_placement` is pure (sizes in, placement out) so it is tested without a GPU; `target_parameters` reads the
size from the checkpoint's safetensors headers (exact, a few KB read), or estimates it from config.json when the
weights are pickles. trainer/targets/loading.py `load_target` asks for a placement whenever it loads onto a GPU
of a machine that shows more than one, and the vLLM backend takes its `tensor_parallel_size` from the same plan
(`tensor_parallel_size`). docs/DEVICES.md, "Targets larger than one GPU".
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from trainer.errors import TargetError

GIB = 1024**3
HEADROOM = 0.25
"""Share of each GPU kept free of weights: the KV cache of generation and validation, activations, the drafter and
CUDA's own context. A quarter leaves an 80 GiB GPU 60 GiB of weights: a 27B target in bfloat16, not a 32B one."""


@dataclass(frozen=True)
class TargetPlacement:
    weight_bytes: int
    gpus: list[int]
    """The GPUs the weights go to: one (no device_map, today's `.to(device)`), or several, split by layers."""
    max_memory: dict[int, int]
    """Bytes of weights transformers may put on each of `gpus` (their memory less HEADROOM)."""

    @property
    def split(self) -> bool:
        return len(self.gpus) > 1

    def from_pretrained_options(self) -> dict:
        """What `from_pretrained` takes for this placement: nothing for one GPU (the caller moves the model),
        else a balanced split over exactly these GPUs; no CPU or disk entry, so nothing is offloaded silently."""
        if not self.split:
            return {}
        return {"device_map": "auto", "max_memory": dict(self.max_memory)}

    def describe(self) -> dict:
        return {"weights_gib": round(self.weight_bytes / GIB, 2), "gpus": list(self.gpus),
                "split": self.split}


def plan_placement(parameters: int, dtype: torch.dtype, gpu_memory: Mapping[int, int], *, first_gpu: int = 0,
                   may_split: bool = True, headroom: float = HEADROOM, name: str = "the target") -> TargetPlacement:
    """Where `parameters` weights of `dtype` go on GPUs of `gpu_memory` (index -> total bytes): `first_gpu` when
    they fit it, else the fewest GPUs from `first_gpu` on whose memory (less `headroom`) holds them. `may_split`
    False (a job pinned to one GPU, or a training rank, which holds a whole target per GPU) allows one GPU only.
    Raises TargetError naming the setting to change when they fit nowhere."""
    weight_bytes = parameters * torch.tensor([], dtype=dtype).element_size()
    usable = {index: int(total * (1 - headroom)) for index, total in sorted(gpu_memory.items())}
    if first_gpu not in usable:
        raise TargetError(f"GPU {first_gpu} is not among this machine's GPUs {sorted(usable)}")
    candidates = [i for i in usable if i >= first_gpu] if may_split else [first_gpu]
    chosen, room = [], 0
    for index in candidates:
        chosen.append(index)
        room += usable[index]
        if room >= weight_bytes:
            return TargetPlacement(weight_bytes, chosen, {i: usable[i] for i in chosen})
    needs = (f"{name} needs {weight_bytes / GIB:.1f} GiB of GPU memory for its weights ({parameters / 1e9:.2f}B "
             f"parameters in {str(dtype).removeprefix('torch.')}), and {len(chosen)} GPU(s) leave "
             f"{room / GIB:.1f} GiB for weights ({headroom:.0%} of each is kept for the KV cache and activations)")
    if not may_split and len(usable) > 1 and sum(usable.values()) >= weight_bytes:
        raise TargetError(f"{needs}; it would fit split over this machine's {len(usable)} GPUs: set compute.device "
                          "to cuda (every visible GPU) instead of one GPU; training keeps a whole target on each "
                          "of its GPUs, so train it on GPUs that hold it")
    fixes = "run it on a node with more GPU memory (DRAFTSMITH_WORKER_DEVICE=cuda uses every visible GPU)"
    if dtype == torch.float32:
        fixes = "set compute.dtype to auto (bfloat16 halves the weights), or " + fixes
    raise TargetError(f"{needs}; {fixes}")


def tensor_parallel_size(placement: TargetPlacement, attention_heads: int, kv_heads: int | None = None) -> int:
    """vLLM's `tensor_parallel_size` for a placement: vLLM shards every layer's heads over the GPUs instead of
    splitting the layers, so it needs a GPU count that divides the heads; the smallest such count not below the
    placement's (1 for a target on one GPU). The backend's own errors name the GPUs when there are too few."""
    for size in range(len(placement.gpus), attention_heads + 1):
        if attention_heads % size == 0 and (not kv_heads or kv_heads % size == 0 or size % kv_heads == 0):
            return size
    return len(placement.gpus)


def target_parameters(path: str | Path, config: dict) -> int:
    """The target's parameter count: summed from its safetensors headers (no tensor data read), else (pickle
    weights only) estimated from config.json. What its weights take in memory, every expert included."""
    sizes = _tensor_sizes(Path(path))
    return sum(sizes.values()) if sizes else estimated_parameters(config)


def active_parameters(path: str | Path, config: dict) -> int:
    """The parameters one token runs through, what a decode step costs in time: all of them for a dense model;
    for a mixture of experts, the routed experts' tensors (named `.experts.`) at the share a token is routed to
    (top-k of E, trainer/targets/families.py). Memory is still `target_parameters`."""
    from trainer.targets.families import active_parameter_fraction

    sizes = _tensor_sizes(Path(path))
    if not sizes:
        return estimated_parameters(config)
    experts = sum(count for name, count in sizes.items() if ".experts." in name)
    return round(sum(sizes.values()) - experts * (1 - active_parameter_fraction(config)))


def _tensor_sizes(path: Path) -> dict[str, int]:
    """Element count of every tensor in the folder's safetensors files, from their headers (a few KB read)."""
    sizes: dict[str, int] = {}
    for file in sorted(path.glob("*.safetensors")):
        with file.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
        for key, entry in header.items():
            if key != "__metadata__":
                count = 1
                for dim in entry["shape"]:
                    count *= dim
                sizes[key] = count
    return sizes


def estimated_parameters(config: dict) -> int:
    """A llama-family decoder's parameters from its config: embeddings (twice when untied), per layer the
    attention (q, k, v, o) and SwiGLU MLP (gate, up, down) matrices and two norms, and the final norm."""
    config = config.get("text_config", config)
    hidden, layers, vocab = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    kv_heads = config.get("num_key_value_heads") or heads
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
    mlp = 3 * hidden * config["intermediate_size"]
    embeddings = vocab * hidden * (1 if config.get("tie_word_embeddings") else 2)
    return embeddings + layers * (attention + mlp + 2 * hidden) + hidden


def gpu_memory(indices: list[int] | None = None) -> dict[int, int]:
    """Total memory of this machine's GPUs (index -> bytes), all visible ones unless `indices` are given."""
    count = torch.cuda.device_count()
    return {i: torch.cuda.get_device_properties(i).total_memory for i in (indices or range(count))}
