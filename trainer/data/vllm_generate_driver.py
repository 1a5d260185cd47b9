"""Runs inside vLLM's own environment (bench/setup/vllm_cpu.sh), started once per generate stage by
trainer/data/vllm_backend.py: `VLLM_PYTHON vllm_generate_driver.py CONFIG_JSON`. Imports only the standard
library and vLLM (the project's packages are not installed there).

CONFIG: {"target": DIR, "dtype": "float32", "max_model_len": N, "tensor_parallel_size": GPUs (1 if absent),
         "lora": {"path": ADAPTER_DIR, "max_rank": N} (absent unless the target is a peft LoRA adapter over DIR)}
It loads one offline `LLM`, writes {"ready": true, "vllm_version": str} and then answers requests, one JSON
line each way, until stdin closes:
  request:  {"prompts": [[ids]], "seeds": [int per prompt], "temperature", "top_p", "top_k", "max_tokens",
             "stop_token_ids": [ids]}
  response: {"tokens": [[ids]], "finish": ["stop" | "length"], "seconds": float}  or  {"error": traceback}
A response's ids end with the stop token when it stopped on one, as the built-in loop's do.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback


def finished(output, stop_token_ids: set[int]) -> tuple[list[int], str]:
    """(token ids, "stop" | "length") of one completion, the stop token kept at the end."""
    tokens = list(output.token_ids)
    if output.finish_reason == "length":
        return tokens, "length"
    if output.finish_reason != "stop":
        raise RuntimeError(f"unexpected finish reason {output.finish_reason!r} (stop reason {output.stop_reason!r})")
    # vLLM keeps the stopping token in token_ids (check_stop looks at the last output token); should a version
    # trim it, stop_reason names it for stop_token_ids. No stop strings are ever asked for.
    if not tokens or tokens[-1] not in stop_token_ids:
        if not isinstance(output.stop_reason, int):
            raise RuntimeError(f"stopped without a stop token (last {tokens[-1:]}, reason {output.stop_reason!r})")
        tokens.append(output.stop_reason)
    return tokens, "stop"


def answer(llm, request: dict, lora=None) -> dict:
    """`lora`: the adapter's LoRARequest, applied to every prompt (the target is the base with that adapter)."""
    from vllm import SamplingParams, TokensPrompt

    stops = [int(t) for t in request["stop_token_ids"]]
    # One SamplingParams per prompt: its own seed gives it its own generator, so a shard is reproducible and
    # prompts sampled together never share one random stream. Greedy ignores the seed and the filters.
    params = [SamplingParams(temperature=request["temperature"], top_p=request["top_p"], top_k=request["top_k"],
                             max_tokens=request["max_tokens"], seed=seed, stop_token_ids=stops, detokenize=False)
              for seed in request["seeds"]]
    started = time.perf_counter()
    results = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in request["prompts"]], params, use_tqdm=False,
                           lora_request=lora)
    seconds = time.perf_counter() - started
    answers = [finished(result.outputs[0], set(stops)) for result in results]
    return {"tokens": [tokens for tokens, _ in answers], "finish": [reason for _, reason in answers],
            "seconds": seconds}


def main(config_json: str) -> int:
    # The protocol owns the original stdout; vLLM (and the engine process it forks) log to stdout, so fd 1
    # becomes stderr (the caller's log file) before vLLM is imported. os.dup's copy is not inherited.
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    config = json.loads(config_json)

    def reply(message: dict) -> None:
        protocol.write(json.dumps(message) + "\n")
        protocol.flush()

    try:
        import vllm
        from vllm import LLM

        # enforce_eager: no torch.compile warm-up (minutes on a small CPU, the same kernels either way).
        # generation_config="vllm": the checkpoint's generation defaults never leak into the job's sampling.
        # No prefix caching: every request is a fresh set of prompts, and it keeps runs comparable.
        # A LoRA target: the base loads as is and the adapter is applied unmerged, one adapter slot.
        adapter = config.get("lora")
        lora_options = {"enable_lora": True, "max_loras": 1, "max_lora_rank": adapter["max_rank"]} if adapter else {}
        llm = LLM(model=config["target"], dtype=config["dtype"], max_model_len=config["max_model_len"], seed=0,
                  enforce_eager=True, enable_prefix_caching=False, generation_config="vllm",
                  tensor_parallel_size=config.get("tensor_parallel_size", 1), **lora_options)
        lora = None
        if adapter:
            from vllm.lora.request import LoRARequest

            lora = LoRARequest("target-adapter", 1, adapter["path"])
    except Exception:
        reply({"error": traceback.format_exc()[-3000:]})
        return 1
    reply({"ready": True, "vllm_version": vllm.__version__})
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            try:
                reply(answer(llm, json.loads(line), lora))
            except Exception:
                reply({"error": traceback.format_exc()[-3000:]})
    finally:
        engine = getattr(llm, "llm_engine", None)
        if engine is not None and hasattr(engine, "engine_core"):
            engine.engine_core.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
