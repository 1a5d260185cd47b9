"""A drafter judged by the reference `dflash` package's own decoder, beside our replay (bench/heldout.py).

Our replay measures tau with our code; a peer's drafter scored only by our code could be scored wrong in its
favour or against it. Here the reference implementation (PyPI `dflash`, the z-lab release our export format is
read by) loads the drafter folder as written and runs its `dflash_generate` on the held-out prompts against the
target: greedy, the drafter's block size, the full vocabulary (the reference reads no draft vocabulary). Each
prompt gives (tokens emitted, target steps), the unit our paired intervals resample, and its output is checked
against the target's own greedy continuation (the held-out reference), token for token: a mismatch is a lossless
failure of the reference decoder with that drafter, and is reported, never dropped.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

REFERENCE_CLASSES = {"DFlashDraftModel", "DFlash2DraftModel"}


@contextlib.contextmanager
def _cpu_timer(model_module):
    """The reference's statistics time with CUDA events; on a CPU a plain clock stands in for them."""
    original = model_module._cuda_time
    model_module._cuda_time = time.perf_counter
    try:
        yield
    finally:
        model_module._cuda_time = original


def reference_model(drafter_dir: Path):
    """The drafter folder loaded by the reference package's class for its architecture, float32, eval."""
    import json

    import dflash.model
    import torch

    architecture = json.loads((drafter_dir / "config.json").read_text())["architectures"][0]
    if architecture not in REFERENCE_CLASSES:
        raise ValueError(f"{drafter_dir}: architecture {architecture} is not one the reference package reads "
                         f"({sorted(REFERENCE_CLASSES)})")
    return getattr(dflash.model, architecture).from_pretrained(drafter_dir, dtype=torch.float32).eval()


def reference_score(target, drafter_dir: Path, references, prompts: int, max_new_tokens: int) -> dict:
    """tau by the reference decoder on the first `prompts` held-out references (at most `max_new_tokens` each),
    its 95 % bootstrap interval, the per-prompt (tokens, steps), and the prompts whose output differs from the
    target's greedy continuation."""
    import dflash.model
    import torch

    from trainer.bootstrap import bootstrap_interval

    model = reference_model(drafter_dir)
    per_prompt, mismatches = [], []
    started = time.perf_counter()
    with _cpu_timer(dflash.model), torch.inference_mode():
        for reference in references[:prompts]:
            prompt = reference.tokens[:reference.prompt_len]
            expected = reference.tokens[reference.prompt_len:][:max_new_tokens]
            out = dflash.model.dflash_generate(model, target.model, torch.tensor([prompt]), max_new_tokens,
                                               target.stop_token_ids(), return_stats=True)
            produced = out.output_ids[0, len(prompt):len(prompt) + len(expected)].tolist()
            if produced != expected:
                mismatches.append(reference.prompt_id)
            per_prompt.append((sum(out.acceptance_lengths), len(out.acceptance_lengths)))
    tokens, steps = sum(t for t, _ in per_prompt), sum(s for _, s in per_prompt)
    return {"tau": round(tokens / max(1, steps), 4),
            "tau_ci95": [round(v, 4) for v in bootstrap_interval(per_prompt)],
            "per_prompt": per_prompt, "prompts": len(per_prompt), "max_new_tokens": max_new_tokens,
            "greedy_mismatches": mismatches, "seconds": round(time.perf_counter() - started, 1)}
