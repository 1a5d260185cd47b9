"""Drafter adapters (preview): a warm start that trains a LoRA over its parent instead of every weight.

A job with `training.drafter_adapter: {"rank": r}` (TrainConfig.drafter_adapter_rank) starts from its parent as every
warm start does (trainer/training/init.py), then wraps the parent's projections in LoRA layers and trains those
alone, as vLLM's RFC 52038 proposes for DFlash drafters: one base drafter, small per-domain adapters.

What is adapted (`ADAPTED_MODULES`): every linear projection of every decoder layer (attention q/k/v/o, the SwiGLU
MLP, and DFlash 2's convolution-kernel projections, which sit inside the layers) and `fc`, the projection of the
target's taps. The RFC wraps "every layer but lm_head and embed_tokens"; a DFlash drafter borrows those two from the
target, so they are never its own to adapt. Left as the parent has them: the norms' gains and the convolutions' base
kernels (vectors, a LoRA has no form for them), the candidate selector (its codebooks are one row per token, a
vocabulary table like the draft vocabulary, and its hidden projection feeds only them) and the draft vocabulary.
Every one of those stays bit-identical to the parent's, so the adapter alone carries what training changed.

Why peft, injected in place: `inject_adapter_in_model` swaps the chosen nn.Linear modules for peft's LoRA layers
inside the Drafter itself, so the objective keeps calling `embed_block`, `propose` and `config` on the drafter it
knows and DeepSpeed sees an ordinary module (its trainable parameters are the LoRA weights alone). At the end the
trained state is put into peft's own `PeftModel` over a plain drafter holding the parent's weights: its
`save_pretrained` writes the adapter (adapter_config.json + adapter_model.safetensors, what `PeftModel.from_pretrained`
loads) and its `merge_and_unload` gives the merged drafter; the file a user loads and the drafter we serve are peft's
arithmetic, not our copy of it. LoRA dropout is 0: a resumed run must give the same losses as an uninterrupted one.

The export serves the merged drafter, unchanged in form (drafter/, GGUF): no serving engine loads a drafter adapter
yet. The adapter ships beside it in `drafter-adapter/` and applies to the parent as the job started it: the parent
itself when it has the job's shape, else the parent upgraded by trainer/drafter/upgrade.py (report.json's
`warm_start.parent.upgrades` says which).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from trainer.atomic import atomic_path, atomic_write_bytes, atomic_write_json
from trainer.drafter.config import DrafterConfig
from trainer.drafter.model import Drafter
from trainer.errors import DraftsmithError

ADAPTER_DIR = "drafter-adapter"
"""The adapter's folder: beside `drafter/` in the trainer's output and in the export."""
ADAPTED_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "kernel_projection",
                   "fc")
"""The module names peft wraps (a name matches itself and any `.name` suffix: every layer's own)."""
ADAPTER_NAME = "default"
"""peft's name for a model's one adapter; it appears in the trained state's keys, never in the saved file's."""
PEFT_PREFIX = "base_model.model."
"""Where a PeftModel keeps the wrapped model: the prefix of every key in adapter_model.safetensors."""
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def lora_config(rank: int, alpha: int, base_name: str | None = None):
    """peft's LoraConfig of a drafter adapter: the modules above, no dropout, no bias."""
    from peft import LoraConfig

    return LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(ADAPTED_MODULES), lora_dropout=0.0, bias="none",
                      base_model_name_or_path=base_name)


def is_lora_name(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def add_adapter(drafter: Drafter, rank: int, alpha: int) -> Drafter:
    """Wrap `drafter`'s adapted projections in LoRA layers (in place; B starts at zero, so the drafter still computes
    exactly what it did) and freeze every other weight. Returns the same drafter."""
    from peft import inject_adapter_in_model

    inject_adapter_in_model(lora_config(rank, alpha), drafter, adapter_name=ADAPTER_NAME)
    for name, parameter in drafter.named_parameters():
        parameter.requires_grad_(is_lora_name(name))
    return drafter


def split_trained_state(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A trained adapter drafter's state dict as (the frozen drafter's own state, under a plain Drafter's names;
    the LoRA weights, under the names peft saves them)."""
    base = {name.replace(".base_layer.", "."): tensor for name, tensor in state.items() if not is_lora_name(name)}
    lora = {PEFT_PREFIX + name.replace(f".{ADAPTER_NAME}.", "."): tensor
            for name, tensor in state.items() if is_lora_name(name)}
    return base, lora


def peft_drafter(base_state: dict[str, torch.Tensor], lora_state: dict[str, torch.Tensor], config: DrafterConfig,
                 rank: int, alpha: int):
    """peft's PeftModel over a float32 drafter holding `base_state`, with the trained LoRA weights loaded."""
    from peft import get_peft_model, set_peft_model_state_dict

    base = Drafter(config)
    base.load_state_dict({name: tensor.float() for name, tensor in base_state.items()})
    model = get_peft_model(base, lora_config(rank, alpha), adapter_name=ADAPTER_NAME)
    lora = {name: tensor.float() for name, tensor in lora_state.items()}
    loaded: Any = set_peft_model_state_dict(model, lora, adapter_name=ADAPTER_NAME)  # peft types its result loosely
    missing = [name for name in loaded.missing_keys if is_lora_name(name)]
    if loaded.unexpected_keys or missing:  # a bug of ours: the state was trained with these very modules
        raise DraftsmithError(f"the trained adapter does not fit the drafter: unexpected {loaded.unexpected_keys[:3]}, "
                              f"missing {missing[:3]}")
    return model.eval()


def save_adapter_and_merge(state: dict[str, torch.Tensor], config: DrafterConfig, rank: int, alpha: int,
                           adapter_dir: str | Path) -> Drafter:
    """Write the PEFT adapter of a trained adapter drafter's `state` into `adapter_dir` (whole or not at all) and
    return the merged drafter: the parent's weights plus alpha / rank x B A in every adapted projection."""
    base_state, lora_state = split_trained_state(state)
    model = peft_drafter(base_state, lora_state, config, rank, alpha)
    adapter_dir = Path(adapter_dir)
    shutil.rmtree(adapter_dir, ignore_errors=True)  # an earlier attempt's: the rename below needs the name free
    adapter_dir.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(adapter_dir) as staging:
        model.save_pretrained(str(staging), safe_serialization=True)
        # peft's own README is a blank model-card template; ours says what this adapter is and what it applies to.
        (staging / "README.md").write_text(adapter_readme(rank, alpha))
    return model.merge_and_unload()  # the draft vocabulary is not a module's: the trainer writes it beside


def adapter_readme(rank: int, alpha: int, base_name: str | None = None) -> str:
    parent = f"`{base_name}`" if base_name else "the job's parent drafter"
    return f"""# Drafter adapter (preview)

A rank-{rank} LoRA (alpha {alpha}) over {parent}, trained by Draftsmith instead of every weight: it adapts the
projections of every drafter layer and the context projection `fc` ({", ".join(ADAPTED_MODULES)}); the norms, the
DFlash 2 base kernels, the candidate selector and the draft vocabulary are the parent's.

It applies to the parent as the job started it: the parent itself when it has the job's shape, else the parent
upgraded to it (report.json `warm_start.parent.upgrades`). `../drafter/` is this adapter merged into that parent: the
drafter to serve, since no serving engine loads drafter adapters yet. With peft:

```python
from peft import PeftModel
drafter = PeftModel.from_pretrained(parent_drafter, "drafter-adapter")  # parent_drafter: a torch module
```
"""


def name_the_base(adapter_dir: str | Path, base_name: str | None) -> None:
    """Record the parent as the job names it (init.from_drafter: a URI or drf_ id) as the adapter's base: the trainer
    knows only its local copy, which must never leave the worker."""
    adapter_dir = Path(adapter_dir)
    config = json.loads((adapter_dir / ADAPTER_CONFIG).read_text())
    config["base_model_name_or_path"] = base_name
    atomic_write_json(adapter_dir / ADAPTER_CONFIG, config)
    atomic_write_bytes(adapter_dir / "README.md", adapter_readme(config["r"], config["lora_alpha"], base_name).encode())


def copy_adapter(source: str | Path, destination: str | Path, base_name: str | None) -> None:
    """The trainer's adapter folder into the export, naming its base; whole or not at all."""
    destination = Path(destination)
    shutil.rmtree(destination, ignore_errors=True)
    with atomic_path(destination) as staging:
        shutil.copytree(source, staging)
        name_the_base(staging, base_name)


def tensor_elements(path: Path) -> int:
    """Parameters in a safetensors file, from its header (nothing is loaded)."""
    from safetensors import safe_open

    total = 0
    with safe_open(str(path), "pt") as weights:
        for name in weights.keys():
            shape = weights.get_slice(name).get_shape()
            total += int(torch.Size(shape).numel())
    return total


def adapter_figures(adapter_dir: str | Path, drafter_dir: str | Path) -> dict:
    """The adapter's size against the drafter it was merged into, for report.json `warm_start.adapter`
    (schemas/validation_report.py DrafterAdapterFigures): read from the two folders' files alone."""
    adapter_dir, drafter_dir = Path(adapter_dir), Path(drafter_dir)
    config = json.loads((adapter_dir / ADAPTER_CONFIG).read_text())
    weights = adapter_dir / ADAPTER_WEIGHTS
    drafter_weights = drafter_dir / "model.safetensors"
    trainable, whole = tensor_elements(weights), tensor_elements(drafter_weights)
    return {"rank": config["r"], "alpha": config["lora_alpha"], "target_modules": sorted(config["target_modules"]),
            "trainable_parameters": trainable, "drafter_parameters": whole,
            "trainable_share": round(trainable / whole, 6) if whole else None,
            "bytes": weights.stat().st_size, "drafter_bytes": drafter_weights.stat().st_size, "folder": ADAPTER_DIR}


def adapter_folder(drafter_dir: str | Path) -> Path | None:
    """The adapter trained with the drafter in `drafter_dir` (its sibling `drafter-adapter/`), or None."""
    folder = Path(drafter_dir).parent / ADAPTER_DIR
    return folder if (folder / ADAPTER_CONFIG).is_file() else None
