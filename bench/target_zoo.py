"""Bench: the prepare self-test (trainer/targets/self_test.py) over the pinned transformers' causal-LM zoo.

For every model type transformers maps to a causal LM, a tiny random model is built from its own config class
(nothing downloaded): the common size settings shrunk (hidden 64, 4 layers, 4 heads, vocabulary 256, ...), with
the default config's per-layer lists cut to the same depth. Types whose config refuses the shrink, whose model
is still large after it (over 20 M parameters), or that are not decoder-only text models are listed as not built,
with the reason. Each built one is wrapped as a `Target` (tokenizer-free) and gets the self-test; printed: its layer
kinds and their rollback (the contract read from the model), the self-test's verdict and time, and for a failure
what failed. This is the list docs/TARGETS.md "Beyond the table" quotes.

    python -m bench.target_zoo [--types llama mamba ...] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

SHRINK = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
          "num_key_value_heads": 2, "vocab_size": 256, "head_dim": 16, "max_position_embeddings": 512,
          "moe_intermediate_size": 32, "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4,
          "num_experts_per_tok": 2, "n_layer": 4, "n_embd": 64, "n_head": 4, "n_positions": 512, "d_model": 64,
          "num_layers": 4, "ffn_dim": 128, "n_inner": 128, "shared_expert_intermediate_size": 32,
          "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
          "linear_value_head_dim": 16, "kv_lora_rank": 16, "q_lora_rank": 32, "qk_rope_head_dim": 8,
          "qk_nope_head_dim": 8, "v_head_dim": 16, "sliding_window": 8, "first_k_dense_replace": 1, "n_group": 1,
          "topk_group": 1, "rotary_dim": 8, "partial_rotary_factor": 0.5}
MAX_PARAMETERS = 20_000_000


class _NoTokenizer:
    eos_token_id = None

    def get_vocab(self) -> dict:
        return {}


def tiny_config(model_type: str, depth: int = 4):
    """The model type's config shrunk (module docstring) to `depth` layers, or raises with why not."""
    from transformers import CONFIG_MAPPING

    config_class = CONFIG_MAPPING[model_type]
    defaults = config_class()
    if getattr(defaults, "is_encoder_decoder", False):
        raise ValueError("an encoder-decoder model")
    text = defaults.get_text_config(decoder=True)
    if text is not defaults:
        raise ValueError("a multimodal wrapper (its text model is tried under its own type)")
    fields = {key: depth if key in ("num_hidden_layers", "num_layers", "n_layer") else value
              for key, value in SHRINK.items() if hasattr(defaults, key)}
    for key, value in defaults.to_dict().items():  # per-layer lists (layer_types, patterns) cut to the depth
        if isinstance(value, list) and len(value) == getattr(defaults, "num_hidden_layers", -1) and len(value) > depth:
            fields[key] = value[:depth]
    if "num_key_value_heads" in fields and "kv_lora_rank" in fields:
        fields["num_key_value_heads"] = fields["num_attention_heads"]  # latent attention: every head its keys
        fields["head_dim"] = fields.get("qk_rope_head_dim", 8)  # and the rotary part is what head_dim sizes
    return config_class(**fields)


def try_type(model_type: str) -> dict:
    """The row of one model type: 4 layers, or 8 where the first 4 of a hybrid hold no attention layer (its
    pattern's attention comes later: Jamba, Bamba, Zamba2, ...), so both kinds are tried."""
    row = _try_type(model_type, 4)
    if "only contain LinearAttention layers" in str(row.get("failure")):
        row = {**_try_type(model_type, 8), "depth": 8}
    return row


def _timeout(_signal, _frame):
    raise TimeoutError(f"over {SECONDS_PER_TYPE} s (a reference kernel's fallback on CPU)")


SECONDS_PER_TYPE = 60


def _try_type(model_type: str, depth: int) -> dict:
    import signal

    import torch
    from transformers import AutoModelForCausalLM

    from trainer.targets.loading import Target
    from trainer.targets.self_test import run_self_test

    try:
        config = tiny_config(model_type, depth)
        with torch.device("meta"):
            size = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
        if size > MAX_PARAMETERS:
            raise ValueError(f"still {size / 1e6:.0f} M parameters after the shrink")
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config).eval()
        model.requires_grad_(False)
    except Exception as exc:  # not built: the reason is the row
        return {"model_type": model_type, "built": False, "why": f"{type(exc).__name__}: {str(exc)[:160]}"}
    started = time.perf_counter()
    signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(SECONDS_PER_TYPE)
    try:  # what load_target then prepare would do with it: wrap it, self-test it
        target = Target(model, _NoTokenizer())
        result = run_self_test(target)
    except Exception as exc:
        return {"model_type": model_type, "built": True, "passed": False, "seconds": None, "kinds": {},
                "rollback": {}, "failure": f"{type(exc).__name__}: {str(exc)[:200]}"}
    finally:
        signal.alarm(0)
    return {"model_type": model_type, "built": True, "passed": bool(result.passed),
            "seconds": round(time.perf_counter() - started, 3), "kinds": result.layer_kinds or {},
            "rollback": result.rollback_by_kind or {}, "failure": result.failure}


def main() -> None:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--types", nargs="+", default=sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES))
    parser.add_argument("--json", type=Path, help="Also write every row as JSON here.")
    args = parser.parse_args()
    rows = []
    print("| model_type | layers (rollback) | self-test | s | what failed |")
    print("|---|---|---|---|---|")
    for model_type in args.types:
        row = try_type(model_type)
        rows.append(row)
        if not row["built"]:
            print(f"| {model_type} | not built: {row['why']} | | | |", flush=True)
            continue
        layers = ", ".join(f"{count} {kind} ({row['rollback'].get(kind)})" for kind, count in row["kinds"].items())
        print(f"| {model_type} | {layers} | {'passed' if row['passed'] else 'REFUSED'} | {row['seconds']} | "
              f"{row['failure'] or ''} |", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
