"""Runs inside vLLM's own environment (bench/setup/vllm_cpu.sh), started by trainer/validation/engines.py:
`VLLM_PYTHON vllm_driver.py JOB.json RESULT.json`. Imports only the standard library and vLLM (the project's
packages are not installed there).

JOB: {"target": DIR, "prompts": [[token ids]], "max_tokens": N, "dtype": "float32",
      "runs": [{"name": str, "speculative_config": dict | null}]}
RESULT: {"vllm_version": str, "runs": [{"name", "speculative_config", "command", "tokens": [[ids]],
         "seconds": [per prompt], "drafts", "draft_tokens", "accepted_tokens", "accepted_per_position"} or
         {"name", "speculative_config", "command", "refused": message}]}

Each run is one offline `LLM` decoding the prompts one at a time (batch 1, greedy), after one untimed
warm-up; acceptance is vLLM's own counters (`vllm:spec_decode_num_drafts` / `_num_draft_tokens` /
`_num_accepted_tokens` / `_per_pos`), read as the difference across the run. vLLM's mean acceptance length
is 1 + accepted / drafts.
"""

from __future__ import annotations

import gc
import json
import sys
import time
import traceback

COUNTERS = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
            "vllm:spec_decode_num_accepted_tokens": "accepted_tokens"}
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"


def counters(llm) -> dict:
    values: dict = {name: 0 for name in COUNTERS.values()}
    values["accepted_per_position"] = []
    for metric in llm.get_metrics():
        if metric.name in COUNTERS:
            values[COUNTERS[metric.name]] += metric.value
        elif metric.name == PER_POSITION:
            per = list(metric.values)
            old = values["accepted_per_position"]
            values["accepted_per_position"] = [a + b for a, b in zip(per, old + [0] * len(per))] if old else per
    return values


def command(job: dict, spec: dict | None) -> str:
    """The same engine settings as a user types them (what the model card prints)."""
    args = (f"LLM(model={job['target']!r}, dtype={job['dtype']!r}, max_model_len={job['max_model_len']}, "
            "enforce_eager=True")
    if spec:
        args += f", speculative_config={json.dumps(spec)}"
    return args + f").generate(prompt_token_ids, SamplingParams(temperature=0, max_tokens={job['max_tokens']}))"


def run_one(job: dict, run: dict) -> dict:
    from vllm import LLM, SamplingParams, TokensPrompt

    spec = run.get("speculative_config")
    out = {"name": run["name"], "speculative_config": spec, "command": command(job, spec)}
    try:
        # enforce_eager: no torch.compile warm-up (minutes on a small CPU, and the same kernels either way).
        llm = LLM(model=job["target"], dtype=job["dtype"], max_model_len=job["max_model_len"], seed=0,
                  speculative_config=spec, disable_log_stats=False, enable_prefix_caching=False, enforce_eager=True)
    except Exception as exc:  # e.g. the V1 runner's "Model Runner V1 does not support: ..."
        out["refused"] = f"{type(exc).__name__}: {exc}"[:2000]
        return out
    try:
        greedy = SamplingParams(temperature=0.0, max_tokens=job["max_tokens"])
        llm.generate([TokensPrompt(prompt_token_ids=job["prompts"][0])], SamplingParams(temperature=0.0, max_tokens=8),
                     use_tqdm=False)  # warm-up, untimed
        before = counters(llm)
        tokens, seconds = [], []
        for ids in job["prompts"]:
            started = time.perf_counter()
            result = llm.generate([TokensPrompt(prompt_token_ids=ids)], greedy, use_tqdm=False)[0]
            seconds.append(time.perf_counter() - started)
            tokens.append(list(result.outputs[0].token_ids))
        after = counters(llm)
        out.update(tokens=tokens, seconds=seconds,
                   **{k: after[k] - before[k] for k in COUNTERS.values()},
                   accepted_per_position=[a - b for a, b in zip(after["accepted_per_position"],
                                                                before["accepted_per_position"]
                                                                + [0] * len(after["accepted_per_position"]))])
    finally:
        engine = getattr(llm, "llm_engine", None)
        if engine is not None and hasattr(engine, "engine_core"):
            engine.engine_core.shutdown()
        del llm
        gc.collect()
    return out


def main(job_file: str, result_file: str) -> int:
    import vllm

    job = json.loads(open(job_file).read())
    runs = []
    for run in job["runs"]:
        try:
            runs.append(run_one(job, run))
        except Exception:
            runs.append({"name": run["name"], "speculative_config": run.get("speculative_config"),
                         "command": command(job, run.get("speculative_config")),
                         "error": traceback.format_exc()[-3000:]})
        with open(result_file, "w") as out:  # after every run: a timeout still leaves what finished
            json.dump({"vllm_version": vllm.__version__, "runs": runs}, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
