"""The target families Draftsmith trains drafters for, and what the pipeline relies on in each: one table.

A target is any Hugging Face causal LM whose `config.json` `model_type` names a family below. What the pipeline
reads from a target is the same for all of them (trainer/targets/loading.py `Target`): the decoder layers at
`get_decoder().layers` and its final norm at `get_decoder().norm` (the taps), the input embedding table and the
LM head (borrowed by the drafter), and a cache that can be put back to the last accepted token after a verify.
What differs per family is recorded here:

- `layer kinds`: full attention, sliding-window attention, or linear attention (a recurrent state, e.g. Gated
  DeltaNet). Attention caches are cropped; a sliding-window cache keeps the tokens a crop may need (transformers'
  past recording); a recurrent state cannot be cropped at all, so a target with a linear layer is put back by
  restoring the state saved before the verify and replaying the accepted tokens (`Rollback.REPLAY`).
- `embedding scale`: Gemma multiplies token embeddings by sqrt(hidden_size) inside its embedding module; the
  drafter reads the raw table (the scale is a constant its first layer learns), recorded so exports say so.
- `final logit soft-capping`: Gemma caps the target's logits (tanh). Verification always uses the target's own
  logits, so the cap never changes what is accepted; drafts from the uncapped head rank tokens the same way.
- `MoE`: routed experts run as the model runs them (transformers' own expert code, no dense fallback); the
  active share of parameters is what a token costs (`active_parameter_fraction`).
- the multimodal wrappers (`qwen3_5`, `qwen3_5_moe`, `gemma3`, `gemma4`) load as their text model where
  transformers maps them to one (Qwen3.5), else with their towers unused (Gemma's conditional-generation class).

Adding a family: one `Family` entry, a tiny config in tests/tiny_targets.py, and it runs through the per-family
tests (tests/trainer/test_target_families.py). Anything else is refused with the supported list.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

ENGINES = ("SGLang", "vLLM", "transformers", "llama.cpp")
"""The serving engines a drafter's export targets (the model card has a command for each one a family has)."""
NOT_MEASURED = ("as the DFlash write-ups and the peers' recipes name them for this family; not measured by "
                "Draftsmith yet")


class Rollback(enum.Enum):
    CROP = "crop"
    """Every layer keeps per-token keys and values: drop the rejected tokens."""
    REPLAY = "replay"
    """A layer carries a recurrent state: restore the state saved before the verify, replay the accepted tokens."""


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]
    """config.json `model_type` values of this family: the text model's, and its multimodal wrapper's."""
    moe: bool = False
    gemma_embedding_scale: bool = False
    engines: tuple[str, ...] = ENGINES
    """Which engines serve a DFlash drafter for this family's targets today: the model card gives a serving
    command for each of these and names the others as not serving this family."""
    engines_measured: bool = True
    """Whether Draftsmith measured those engines on this family (else the card says whose word it is)."""
    gguf: bool = True
    """Whether Draftsmith writes the drafter's GGUF: the target's vocabulary is byte-level BPE, the one kind the
    GGUF writer exports (trainer/export/gguf_tokenizer.py). Gemma's is SentencePiece: llama.cpp's own converter."""


FAMILIES = (
    Family("Llama", ("llama",)),
    Family("Mistral", ("mistral",)),
    Family("Qwen2", ("qwen2",)),
    Family("Qwen3", ("qwen3",)),
    Family("Qwen3 MoE", ("qwen3_moe",), moe=True, engines=("SGLang", "vLLM", "transformers"), engines_measured=False),
    Family("Qwen3.5 (hybrid Gated DeltaNet)", ("qwen3_5_text", "qwen3_5"),
           engines=("SGLang", "transformers", "llama.cpp"),
           engines_measured=False),
    Family("Qwen3.5 MoE (hybrid Gated DeltaNet)", ("qwen3_5_moe_text", "qwen3_5_moe"), moe=True,
           engines=("SGLang", "transformers"), engines_measured=False),
    Family("Qwen3-Next (hybrid Gated DeltaNet, MoE)", ("qwen3_next",), moe=True,
           engines=("SGLang", "transformers"), engines_measured=False),
    Family("Gemma 3", ("gemma3_text", "gemma3"), gemma_embedding_scale=True, gguf=False,
           engines=("transformers",), engines_measured=False),
    Family("Gemma 4", ("gemma4_text", "gemma4"), gemma_embedding_scale=True, gguf=False,
           engines=("transformers",), engines_measured=False),
    Family("gpt-oss (MoE)", ("gpt_oss",), moe=True, engines=("SGLang", "transformers"), engines_measured=False),
)
BY_MODEL_TYPE = {model_type: family for family in FAMILIES for model_type in family.model_types}
SUPPORTED_MODEL_TYPES = frozenset(BY_MODEL_TYPE)
ADD_A_FAMILY_HINT = ("ask for it to be added (an entry in trainer/targets/families.py and its tests: "
                     "docs/TARGETS.md, 'Adding a family')")


def family_of(model_type: str | None) -> Family | None:
    return BY_MODEL_TYPE.get(model_type or "")


def text_config(config: dict) -> dict:
    """The text model's part of a config.json (a multimodal wrapper keeps it under text_config)."""
    return config.get("text_config") or config


def layer_kinds(config: dict) -> list[str]:
    """Each decoder layer's kind: "full", "sliding" or "linear" (from `layer_types`, else the sliding window)."""
    text = text_config(config)
    count = int(text.get("num_hidden_layers") or 0)
    types = text.get("layer_types")
    if types:
        return ["linear" if "linear" in kind else "sliding" if "sliding" in kind else "full" for kind in types]
    sliding = text.get("sliding_window") and text.get("use_sliding_window", True)
    return ["sliding" if sliding else "full"] * count


def rollback_of(config: dict) -> Rollback:
    return Rollback.REPLAY if "linear" in layer_kinds(config) else Rollback.CROP


def embedding_scale(config: dict) -> float:
    family = family_of(config.get("model_type"))
    if family is not None and family.gemma_embedding_scale:
        return math.sqrt(text_config(config)["hidden_size"])
    return 1.0


def final_logit_softcap(config: dict) -> float | None:
    return text_config(config).get("final_logit_softcapping") or None


def active_parameter_fraction(config: dict) -> float:
    """The share of the routed experts' weights one token runs through (1.0 for a dense model): top-k of E."""
    text = text_config(config)
    experts = text.get("num_experts") or text.get("num_local_experts")
    chosen = text.get("num_experts_per_tok")
    if not experts or not chosen:
        return 1.0
    return min(1.0, chosen / experts)


def describe(config: dict) -> dict:
    """What the pipeline records of a target's family (report.json, model card)."""
    family = family_of(config.get("model_type"))
    kinds = layer_kinds(config)
    return {
        "family": family.name if family else config.get("model_type"),
        "model_type": config.get("model_type"),
        "layer_kinds": {kind: kinds.count(kind) for kind in ("full", "sliding", "linear") if kind in kinds},
        "rollback": rollback_of(config).value,
        "moe": bool(family and family.moe),
        "active_expert_fraction": active_parameter_fraction(config),
        "embedding_scale": embedding_scale(config),
        "final_logit_softcap": final_logit_softcap(config),
        "engines": list(family.engines) if family else [],
        "engines_note": "" if family is None or family.engines_measured else NOT_MEASURED,
        "gguf": bool(family and family.gguf),
    }
