"""Tiny DFlash, DFlash 2 and DSpark drafters built, saved and run by vLLM `speculators` 0.9.0's own code, for the
check that trainer/drafter/formats.py reads what speculators writes (tests/bench/test_speculators_parent.py).

Executed with the speculators venv's python (`bash bench/setup/speculators.sh`), never imported by the project:

    .engines/speculators/bin/python bench/peers/speculators_parent.py OUT [--variants dflash,dflash2,dspark,dflash-sliding,dflash-gelu]

OUT/target: a tiny random Qwen3 target (transformers' own save; speculators reads its verifier's embedding, LM head
and final norm from it). For each variant, OUT/<variant>: the drafter as speculators' CLI builds one
(`create_transformer_layer_config` from the target, every layer full attention, then the class's
`from_training_args`, which also writes the `speculators_config`), its trainable weights then drawn at random so
that nothing is at an identity initialisation, saved with its `save_pretrained`, and loaded back with its
`from_pretrained` (as `speculators train --from-pretrained` does). The loaded model runs its own anchored-block
forward (`_backbone_forward`, what its training forward runs) on fixed target taps, and OUT/<variant>/expected.
safetensors holds the inputs, the anchors, its final hidden states, its logits and its drafts (greedy): DFlash
the argmax of each mask slot mapped through d2t, DFlash 2 the greedy walk of its own `CandidateSelector.select`
from the anchor, DSpark the backbone's argmax at every slot (its Markov bias is a head our drafter has none of).
Two more DFlash folders are built the same way with what our drafter does not compute (`REFUSED`), for the
check that formats.py refuses them. OUT/summary.json: versions, each folder's tensor names and config keys.
"""

from __future__ import annotations

import argparse
import json
from importlib.metadata import version
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from speculators.model import SpeculatorModel
from speculators.models.dflash import DFlashDraftModel
from speculators.models.dflash2 import DFlash2DraftModel
from speculators.models.dspark import DSparkDraftModel
from speculators.train.cli import create_transformer_layer_config
from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution
from transformers import Qwen3Config, Qwen3ForCausalLM

CLASSES = {"dflash": DFlashDraftModel, "dflash2": DFlash2DraftModel, "dspark": DSparkDraftModel}
REFUSED = {"dflash-sliding": {"full_attention_indices": []}, "dflash-gelu": {"hidden_act": "gelu"}}
"""DFlash drafters speculators builds that our drafter does not compute the same way (formats.py refuses them):
its CLI's default, every layer sliding-window (and, for DFlash, causal inside the block), and `--draft-hidden-act
gelu`."""
TARGET = {"vocab_size": 128, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 512,
          "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, "tie_word_embeddings": False,
          "initializer_range": 0.3}
"""A small Qwen3; a rope_theta off Qwen3Config's default, so that it travels in speculators' config diff."""
AUX_LAYER_IDS = [2, 4]
"""speculators' tap ids (HF hidden_states indices; ours are these - 1)."""
BLOCK_SIZE, MASK_TOKEN_ID, DRAFT_LAYERS = 4, 5, 2
DRAFT_VOCAB = {"dflash": 48, "dflash2": None, "dspark": None}
"""DFlash with a draft vocabulary (its d2t/t2d and reduced head); DFlash 2 requires the full one."""
DFLASH2_WIDTHS = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 8, "selector_top_k": 4}
SEQ_LEN, ANCHORS = 24, 4


def write_target(folder: Path) -> None:
    torch.manual_seed(0)
    Qwen3ForCausalLM(Qwen3Config(**TARGET)).save_pretrained(folder)


def vocab_maps(size: int | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """d2t and t2d by speculators' own builder, from a made-up token frequency count."""
    if size is None:
        return None, None
    generator = torch.Generator().manual_seed(1)
    counts = torch.randint(1, 1000, (TARGET["vocab_size"],), generator=generator)
    return build_vocab_mappings_from_distribution({i: int(c) for i, c in enumerate(counts)}, size,
                                                  TARGET["vocab_size"])


@torch.no_grad()
def randomise(model: torch.nn.Module, seed: int) -> None:
    """Every trainable tensor away from its initialisation: norms about 1, convolutions about the identity,
    the rest N(0, 0.1) (the selector's codebooks N(0, 0.5), so that it changes some picks)."""
    torch.manual_seed(seed)
    for name, tensor in model.named_parameters():
        if not tensor.requires_grad:  # the verifier's frozen copies
            continue
        noise = torch.randn_like(tensor)
        if name.endswith("norm.weight"):
            tensor.copy_(1 + 0.1 * noise)
        elif name.endswith("base_kernel"):
            tensor.add_(0.3 * noise)
        elif "codebook" in name:
            tensor.copy_(0.5 * noise)
        else:
            tensor.copy_(0.1 * noise)


def build(variant: str, target: Path, folder: Path) -> None:
    """The drafter as `speculators train` builds it (the CLI's draft-construction path), randomised and saved."""
    shaping = {"hidden_act": None, "full_attention_indices": list(range(DRAFT_LAYERS)), **REFUSED.get(variant, {})}
    variant = variant.split("-")[0]
    layer_config = create_transformer_layer_config(
        verifier_name_or_path=str(target), num_layers=DRAFT_LAYERS, draft_arch="qwen3", sliding_window=2048,
        **shaping)
    d2t, t2d = vocab_maps(DRAFT_VOCAB[variant])
    kwargs = {"verifier_name_or_path": str(target), "target_layer_ids": AUX_LAYER_IDS, "block_size": BLOCK_SIZE,
              "mask_token_id": MASK_TOKEN_ID, "draft_vocab_size": DRAFT_VOCAB[variant] or TARGET["vocab_size"],
              "draft_attn_impl": "sdpa"}
    if variant == "dflash2":
        kwargs.update(DFLASH2_WIDTHS)
    if variant == "dspark":
        kwargs.update(markov_rank=8)
    model = CLASSES[variant].from_training_args(verifier_config=layer_config, t2d=t2d, d2t=d2t, **kwargs)
    randomise(model, seed=len(variant))
    model.save_pretrained(folder)


def load(variant: str, folder: Path) -> torch.nn.Module:
    """Its own loader, as its CLI's `--from-pretrained` calls it (the attention backend is not serialised)."""
    variant = variant.split("-")[0]
    config = CLASSES[variant].config_class.from_pretrained(folder)
    config.transformer_layer_config._attn_implementation = "sdpa"
    model = SpeculatorModel.from_pretrained(folder, config=config)
    assert type(model) is CLASSES[variant], type(model)
    return model.eval()


def inputs() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(2)
    taps = len(AUX_LAYER_IDS) * TARGET["hidden_size"]
    loss_mask = torch.ones(1, SEQ_LEN, dtype=torch.long)
    loss_mask[:, :3] = 0  # anchors from position 3: every block has target context, as in decoding
    return {"input_ids": torch.randint(0, TARGET["vocab_size"], (1, SEQ_LEN), generator=generator),
            "hidden_states": torch.randn(1, SEQ_LEN, taps, generator=generator),
            "verifier_last_hidden_states": torch.randn(1, SEQ_LEN, TARGET["hidden_size"], generator=generator),
            "loss_mask": loss_mask, "document_ids": torch.zeros(1, SEQ_LEN, dtype=torch.long)}


def greedy_walk(model, logits: torch.Tensor, hidden: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
    """DFlash 2's drafts by its own selector: at each mask slot, its top-k of the logits rescored after the
    token chosen before (the anchor first); the best scored is chosen."""
    blocks = logits.view(len(anchors), BLOCK_SIZE, -1)
    states = hidden.view(len(anchors), BLOCK_SIZE, -1)
    predecessor = anchors.clone()
    path = []
    for slot in range(1, BLOCK_SIZE):
        candidates, scores = model.candidate_selector.select(blocks[:, slot], states[:, slot], predecessor)
        predecessor = candidates.gather(-1, scores.argmax(-1, keepdim=True))[:, 0]
        path.append(predecessor)
    return torch.stack(path, dim=1)


@torch.no_grad()
def run(model, fixed: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    torch.manual_seed(3)  # its anchors are drawn at random
    hidden, logits, _, _, indices = model._backbone_forward(**fixed, max_anchors=ANCHORS)
    anchor_positions = indices.view(ANCHORS, BLOCK_SIZE)[:, 0]
    anchor_ids = fixed["input_ids"][0, anchor_positions]
    if model.config.speculators_model_type == "dflash2":
        drafts = greedy_walk(model, logits[0], hidden[0], anchor_ids)
    else:
        first = 0 if model.config.sample_from_anchor else 1
        drafts = logits[0].view(ANCHORS, BLOCK_SIZE, -1)[:, first:].argmax(-1)
        if model.d2t is not None:  # draft ids to target ids: its offsets
            drafts = drafts + model.d2t[drafts]
    return {**fixed, "anchor_positions": anchor_positions, "hidden": hidden[0], "logits": logits[0],
            "drafts": drafts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--variants", default=",".join([*CLASSES, *REFUSED]))
    args = parser.parse_args()
    write_target(args.out / "target")
    fixed = inputs()
    summary = {"speculators": version("speculators"), "torch": torch.__version__,
               "transformers": version("transformers"), "aux_hidden_state_layer_ids": AUX_LAYER_IDS,
               "block_size": BLOCK_SIZE, "mask_token_id": MASK_TOKEN_ID, "variants": {}}
    for variant in args.variants.split(","):
        folder = args.out / variant
        build(variant, args.out / "target", folder)
        model = load(variant, folder)
        expected = run(model, fixed)
        with safe_open(folder / "model.safetensors", framework="pt") as saved:
            names = sorted(saved.keys())  # noqa: SIM118 (safe_open is not a mapping)
        config = json.loads((folder / "config.json").read_text())
        save_file({k: v.contiguous() for k, v in expected.items()}, folder / "expected.safetensors")
        summary["variants"][variant] = {
            "class": type(model).__name__, "tensors": names, "config_keys": sorted(config),
            "sample_from_anchor": config.get("sample_from_anchor"),
            "state_dict": sorted(model.state_dict()),
            "ignored_on_save": sorted(model._keys_to_ignore_on_save)}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps({v: s["tensors"] for v, s in summary["variants"].items()}))


if __name__ == "__main__":
    main()
