"""Tiny DFlash and DSpark drafters built, exported and run by SpecForge 0.2.0's own code, for the check that
trainer/drafter/formats.py reads what SpecForge writes (tests/bench/test_specforge_parent.py).

Executed with the SpecForge venv's python (`bash bench/setup/specforge.sh`), never imported by the project:

    .engines/specforge/bin/python bench/peers/specforge_parent.py OUT [--variants dflash,dspark]

OUT/target: a tiny random Qwen3 target (transformers' own save). For each variant, OUT/<variant>: the drafter from
a draft config as SpecForge's trainer reads one (`AutoDraftModelConfig.from_file`, `AutoDraftModel.from_config`),
its weights drawn at random so that nothing is at an identity initialisation, then written by SpecForge's own
`specforge export --to hf` code (`specforge.export.to_hf.export_to_hf`: `materialize_draft` checks the state
against the architecture, `save_pretrained`, `apply_legacy_rope_scaling`). The training state it exports is
handed over in memory (its `resolve_training_state` is replaced by one returning it) rather than as the
`training_state.pt` pickle its trainer writes: nothing here unpickles. The folder is loaded back with its
`AutoDraftModel.from_pretrained` and its forward runs one decoding step per anchor as its `spec_generate` does
(the target's taps before the anchor, the target's embedding of [anchor, MASK...]); OUT/<variant>/expected.
safetensors holds the inputs, the anchors, its final hidden states, the target head's logits and its drafts
(`_sample_draft_tokens`, greedy; for DSpark the backbone's argmax, since its Markov head is one our drafter has
none of). OUT/summary.json: versions and each folder's tensor names.
"""

from __future__ import annotations

import argparse
import json
from importlib.metadata import version
from pathlib import Path

import specforge.export.to_hf as to_hf
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from specforge.modeling.auto import AutoDraftModel, AutoDraftModelConfig
from specforge.modeling.draft.dflash import sample
from transformers import Qwen3Config, Qwen3ForCausalLM

TARGET = {"vocab_size": 128, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 512,
          "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, "tie_word_embeddings": False,
          "initializer_range": 0.3, "rms_norm_eps": 1e-6}
TARGET_LAYER_IDS = [1, 3]
"""SpecForge's tap ids are the reference's (HF hidden_states index - 1), as ours are."""
BLOCK_SIZE, MASK_TOKEN_ID, DRAFT_LAYERS = 4, 5, 2
DSPARK = {"projector_type": "dspark", "markov_rank": 8, "markov_head_type": "vanilla",
          "enable_confidence_head": True, "confidence_head_with_markov": True}
ARCHITECTURES = {"dflash": "DFlashDraftModel", "dspark": "DSparkDraftModel"}
SEQ_LEN, ANCHORS = 24, [4, 9, 12, 19]


def write_target(folder: Path) -> None:
    torch.manual_seed(0)
    Qwen3ForCausalLM(Qwen3Config(**TARGET)).save_pretrained(folder)


def draft_config(variant: str) -> dict:
    """A draft config in the reference `dflash` layout, as SpecForge's DFlash examples write one."""
    dflash = {"block_size": BLOCK_SIZE, "mask_token_id": MASK_TOKEN_ID, "target_layer_ids": TARGET_LAYER_IDS,
              **(DSPARK if variant == "dspark" else {})}
    return {**TARGET, "architectures": [ARCHITECTURES[variant]], "model_type": "qwen3", "hidden_act": "silu",
            "num_hidden_layers": DRAFT_LAYERS, "num_target_layers": TARGET["num_hidden_layers"],
            "block_size": BLOCK_SIZE, "layer_types": ["full_attention"] * DRAFT_LAYERS, "use_sliding_window": False,
            "attention_bias": False, "dflash_config": dflash}


@torch.no_grad()
def randomise(model: torch.nn.Module, seed: int) -> None:
    """Every tensor away from its initialisation: norms about 1, the rest N(0, 0.1)."""
    torch.manual_seed(seed)
    for name, tensor in model.named_parameters():
        noise = torch.randn_like(tensor)
        tensor.copy_(1 + 0.1 * noise if name.endswith("norm.weight") else 0.1 * noise)


def export(variant: str, work: Path, folder: Path) -> None:
    """Built as its trainer builds the draft, randomised, and written by its own HF exporter."""
    config_path = work / f"{variant}-draft.json"
    config_path.write_text(json.dumps(draft_config(variant)))
    model = AutoDraftModel.from_config(AutoDraftModelConfig.from_file(str(config_path)))
    randomise(model, seed=len(variant))
    state = {"strategy": variant, "draft_state_dict": {k: v.clone() for k, v in model.state_dict().items()
                                                        if "embed" not in k.lower()}}  # its checkpoint filter
    to_hf.resolve_training_state = lambda _path: state
    to_hf.export_to_hf("in-memory", str(config_path), str(folder))


def load(folder: Path) -> torch.nn.Module:
    model = AutoDraftModel.from_pretrained(folder, dtype=torch.float32)
    model.config._attn_implementation = "sdpa"
    return model.eval()


def inputs() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(2)
    taps = len(TARGET_LAYER_IDS) * TARGET["hidden_size"]
    return {"input_ids": torch.randint(0, TARGET["vocab_size"], (1, SEQ_LEN), generator=generator),
            "hidden_states": torch.randn(1, SEQ_LEN, taps, generator=generator),
            "anchor_positions": torch.tensor(ANCHORS)}


@torch.no_grad()
def run(variant: str, model, target, fixed: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One `spec_generate` drafting step per anchor, without a cache (all of the context is new)."""
    hidden, logits, drafts = [], [], []
    for anchor in ANCHORS:
        block = torch.full((1, BLOCK_SIZE), MASK_TOKEN_ID)
        block[0, 0] = fixed["input_ids"][0, anchor]
        out = model(target_hidden=fixed["hidden_states"][:, :anchor],
                    noise_embedding=target.model.embed_tokens(block),
                    position_ids=torch.arange(anchor + BLOCK_SIZE)[None], is_causal=False)
        hidden.append(out[0])
        logits.append(target.lm_head(out)[0])
        if variant == "dspark":  # the backbone's drafts; its Markov head would bias them
            drafts.append(sample(target.lm_head(out[:, 1:]))[0])
        else:
            drafts.append(model._sample_draft_tokens(target, out, block)[0])
    return {**fixed, "hidden": torch.cat(hidden), "logits": torch.cat(logits), "drafts": torch.stack(drafts)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--variants", default=",".join(ARCHITECTURES))
    args = parser.parse_args()
    write_target(args.out / "target")
    target = Qwen3ForCausalLM.from_pretrained(args.out / "target", dtype=torch.float32).eval()
    fixed = inputs()
    summary = {"specforge": version("specforge"), "torch": torch.__version__, "transformers": version("transformers"),
               "variants": {}}
    for variant in args.variants.split(","):
        folder = args.out / variant
        export(variant, args.out, folder)
        model = load(folder)
        expected = run(variant, model, target, fixed)
        with safe_open(folder / "model.safetensors", framework="pt") as saved:
            names = sorted(saved.keys())  # noqa: SIM118 (safe_open is not a mapping)
        save_file({k: v.contiguous() for k, v in expected.items()}, folder / "expected.safetensors")
        config = json.loads((folder / "config.json").read_text())
        summary["variants"][variant] = {"class": type(model).__name__, "tensors": names,
                                        "dflash_config": config.get("dflash_config")}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps({v: s["tensors"] for v, s in summary["variants"].items()}))


if __name__ == "__main__":
    main()
