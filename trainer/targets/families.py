"""What the pipeline cannot read from a target itself, by family: one table of exceptions to the target contract.

What speculative decoding, generation and training rely on in a target (its layers and their kinds, how each
layer's cache rolls back, the embedding scale, the logit soft-cap, a tied head, routed experts) is read from the
loaded model and the cache it builds (trainer/targets/contract.py), and checked on the checkpoint itself at
prepare (trainer/targets/self_test.py): any causal LM transformers loads that passes the self-test runs, listed
here or not. This table keeps what no model object says:

- `engines`: which serving engines serve a DFlash drafter for the family today (the model card's commands), and
  whether Draftsmith measured them;
- `gguf`: whether the GGUF writer exports the family's vocabulary (byte-level BPE, and Gemma's SentencePiece
  kinds, as llama.cpp's converter writes each);
- the family's name for the report and the card (an unlisted model_type is named by itself).

The config-only readers below (`layer_kinds`, `rollback_of`, `describe`) say what config.json alone implies, for
what runs before a model is loaded (placement's active share); a loaded target's description is `describe_loaded`,
from its contract. For the twelve families both agree (tests/trainer/test_target_families.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainer.targets.contract import EXPERT_COUNT_KEYS, Contract
from trainer.targets.contract import Rollback as Rollback  # re-exported: the decoders' and benches' import

ENGINES = ("SGLang", "vLLM", "transformers", "llama.cpp")
"""The serving engines a drafter's export targets (the model card has a command for each one a family has)."""
NOT_MEASURED = ("as the DFlash write-ups and the peers' recipes name them for this family; not measured by "
                "Draftsmith yet")
UNLISTED_ENGINES = ("this architecture has no entry in trainer/targets/families.py: no serving engine is known to "
                    "serve a DFlash drafter for it yet; it passed the self-test, and Draftsmith's own decoder "
                    "(`draftsmith decode`) runs it over transformers")
UNLISTED_GGUF = ("this architecture has no entry in trainer/targets/families.py, whose entries say which vocabularies "
                 "the GGUF writer exports: convert `drafter/` with llama.cpp's convert_hf_to_gguf.py "
                 "--target-model-dir TARGET")


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
    """Whether Draftsmith writes the drafter's GGUF: the GGUF writer exports the family's vocabulary the way
    llama.cpp's converter does for its architecture (trainer/export/gguf_tokenizer.py: byte-level BPE;
    gguf_sentencepiece.py: Gemma 3's SentencePiece model, Gemma 4's byte-fallback BPE)."""


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
    Family("Gemma 3", ("gemma3_text", "gemma3"), gemma_embedding_scale=True,
           engines=("transformers",), engines_measured=False),
    Family("Gemma 4", ("gemma4_text", "gemma4"), gemma_embedding_scale=True,
           engines=("transformers",), engines_measured=False),
    Family("gpt-oss (MoE)", ("gpt_oss",), moe=True, engines=("SGLang", "transformers"), engines_measured=False),
)
BY_MODEL_TYPE = {model_type: family for family in FAMILIES for model_type in family.model_types}
SUPPORTED_MODEL_TYPES = frozenset(BY_MODEL_TYPE)
"""The model types whose engines and GGUF support are known; others run when the self-test passes."""


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
    experts = next((text[key] for key in EXPERT_COUNT_KEYS if text.get(key)), None)
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
        "engines_note": UNLISTED_ENGINES if family is None else "" if family.engines_measured else NOT_MEASURED,
        "gguf": bool(family and family.gguf),
    }


def describe_loaded(config: dict, contract: Contract) -> dict:
    """What the pipeline records of a loaded target (report.json's `target`, the model card): its contract, read
    from the model, and the table's entry, if the family has one."""
    family = family_of(config.get("model_type"))
    return {
        "family": family.name if family else config.get("model_type"),
        "model_type": config.get("model_type"),
        "layer_kinds": contract.layer_kinds(),
        "rollback": contract.rollback.value,
        "rollback_by_kind": contract.rollback_by_kind(),
        "moe": contract.moe,
        "active_expert_fraction": contract.active_expert_fraction,
        "embedding_scale": contract.embedding_scale,
        "final_logit_softcap": contract.final_logit_softcap,
        "tied_head": contract.tied_head,
        "engines": list(family.engines) if family else [],
        "engines_note": UNLISTED_ENGINES if family is None else "" if family.engines_measured else NOT_MEASURED,
        "gguf": bool(family and family.gguf),
    }
