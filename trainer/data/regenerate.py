"""Regeneration: the target answers every training prompt with the job's sampling parameters and chat
template, so the drafter learns the very distribution it will be verified against.

Prompts go through in left-padded batches with one KV cache per batch; finished rows leave the batch.
The tapped hidden states are captured during the same passes (no second target pass) and stored in
bfloat16 next to the tokens, unless the estimated cache exceeds the budget, in which case training
recomputes them. Work is cut into shards written atomically, so an interrupted run resumes at the
first missing shard.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from schemas.sampling import SamplingParams
from trainer.data.prompts import Prompt
from trainer.data.store import DataStore, Example
from trainer.errors import DraftsmithError
from trainer.sampling import sample, target_probs
from trainer.targets.chat import render_prompt
from trainer.targets.loading import Target

HIDDEN_DTYPE = torch.bfloat16


class DataError(DraftsmithError):
    """Regeneration cannot start or continue as asked."""


@dataclass(frozen=True)
class RegenerationPlan:
    prompts: int
    prompt_tokens: int
    max_new_tokens: int
    hidden_bytes_estimate: int
    cache_hidden: bool

    def describe(self) -> str:
        choice = "cache them with the data" if self.cache_hidden else "recompute them online during training"
        return (f"{self.prompts} prompts, {self.prompt_tokens} prompt tokens, up to {self.max_new_tokens} new tokens "
                f"each; hidden-state cache estimate {self.hidden_bytes_estimate / 2**20:.0f} MiB -> {choice}")


def tokenize_prompts(target: Target, prompts: list[Prompt], params: SamplingParams) -> list[list[int]]:
    """Render every prompt and check it fits the target's context with room for the response."""
    limit = target.config.max_position_embeddings
    rendered = []
    for prompt in prompts:
        ids = render_prompt(target.tokenizer, list(prompt.messages), params.chat_template)
        if len(ids) + params.max_new_tokens > limit:
            raise DataError(f"prompt {prompt.id!r} has {len(ids)} tokens; with max_new_tokens "
                            f"{params.max_new_tokens} it exceeds the target's context of {limit}; "
                            "shorten the prompt or lower max_new_tokens")
        rendered.append(ids)
    return rendered


def plan_regeneration(target: Target, prompt_ids: list[list[int]], params: SamplingParams, num_taps: int,
                      cache_budget_bytes: int) -> RegenerationPlan:
    prompt_tokens = sum(len(ids) for ids in prompt_ids)
    # Upper bound: every response runs to max_new_tokens. 2 bytes per bfloat16 value.
    tokens = prompt_tokens + len(prompt_ids) * params.max_new_tokens
    estimate = tokens * num_taps * target.hidden_size * 2
    return RegenerationPlan(len(prompt_ids), prompt_tokens, params.max_new_tokens, estimate,
                            estimate <= cache_budget_bytes)


@torch.inference_mode()
def generate_batch(target: Target, prompts: list[list[int]], params: SamplingParams, tap_layer_ids: list[int] | None,
                   generator: torch.Generator | None = None) -> list[tuple[list[int], torch.Tensor | None, str]]:
    """Responses to a batch of tokenised prompts: (response ids, taps of prompt+response[:-1], stop reason).

    Left padding keeps every row's newest token in the last column; positions count real tokens only.
    """
    device, pad = target.device, target.tokenizer.pad_token_id or 0
    stop = torch.tensor(target.stop_token_ids(), device=device)
    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    positions = (attention.cumsum(-1) - 1).clamp_min(0)
    cache = target.new_cache()
    logits, taps = target.forward(input_ids, positions, cache, tap_layer_ids, logits_to_keep=1,
                                  attention_mask=attention)
    rows = list(range(len(prompts)))  # original index of each live row
    responses: list[list[int]] = [[] for _ in prompts]
    hidden: list[list[torch.Tensor]] = [[taps[i, width - len(p):]] if taps is not None else [] for i, p in enumerate(prompts)]
    reasons = ["length"] * len(prompts)
    next_pos = positions[:, -1] + 1
    for step in range(params.max_new_tokens):
        last = logits[:, -1]
        tokens = last.argmax(-1) if params.greedy else sample(target_probs(last, params), generator)
        finished = torch.isin(tokens, stop) | (step + 1 == params.max_new_tokens)
        for live, row in enumerate(rows):
            responses[row].append(int(tokens[live]))
            if torch.isin(tokens[live], stop):
                reasons[row] = "stop"
        keep = (~finished).nonzero()[:, 0]
        if keep.numel() == 0:
            break
        if keep.numel() < len(rows):  # finished rows leave the batch and the cache
            cache.batch_select_indices(keep)
            rows = [rows[i] for i in keep.tolist()]
            tokens, attention, next_pos = tokens[keep], attention[keep], next_pos[keep]
        attention = torch.cat([attention, torch.ones_like(attention[:, :1])], dim=1)
        logits, taps = target.forward(tokens[:, None], next_pos[:, None], cache, tap_layer_ids,
                                      attention_mask=attention)
        next_pos = next_pos + 1
        if taps is not None:
            for live, row in enumerate(rows):
                hidden[row].append(taps[live])
    return [(responses[i], torch.cat(hidden[i]).to(HIDDEN_DTYPE) if hidden[i] else None, reasons[i])
            for i in range(len(prompts))]


def regenerate(target: Target, prompts: list[Prompt], params: SamplingParams, out_dir: str | Path, *,
               tap_layer_ids: list[int], cache_budget_bytes: int = 4 << 30, shard_size: int = 64,
               batch_size: int = 16, on_progress: Callable[[int, int, int], None] | None = None) -> DataStore:
    """Write the regenerated training set to `out_dir`; skip shards already complete. on_progress gets
    (prompts done, prompts total, tokens generated so far)."""
    prompt_ids = tokenize_prompts(target, prompts, params)
    plan = plan_regeneration(target, prompt_ids, params, len(tap_layer_ids), cache_budget_bytes)
    meta = {
        "target_fingerprint": target.fingerprint, "sampling": params.model_dump(mode="json"),
        "tap_layer_ids": list(tap_layer_ids), "hidden_cached": plan.cache_hidden,
        "hidden_dtype": str(HIDDEN_DTYPE).removeprefix("torch."), "shard_size": shard_size,
        "prompt_ids": [p.id for p in prompts], "plan": plan.describe(),
    }
    store = DataStore.create(out_dir, meta)
    shards = math.ceil(len(prompts) / shard_size)
    done, tokens = 0, 0
    for shard in range(shards):
        chunk = range(shard * shard_size, min(len(prompts), (shard + 1) * shard_size))
        if store.has_shard(shard):
            done += len(chunk)
            tokens += store.shard_tokens(shard)
            continue
        generator = torch.Generator().manual_seed(params.seed * 100_003 + shard)
        # Similar lengths per batch waste less padding.
        order = sorted(chunk, key=lambda i: len(prompt_ids[i]))
        examples: dict[int, Example] = {}
        for start in range(0, len(order), batch_size):
            batch = order[start:start + batch_size]
            outputs = generate_batch(target, [prompt_ids[i] for i in batch], params,
                                     tap_layer_ids if plan.cache_hidden else None, generator)
            for i, (response, hidden, reason) in zip(batch, outputs, strict=True):
                examples[i] = Example(prompts[i].id, prompts[i].category, prompt_ids[i] + response,
                                      len(prompt_ids[i]), reason, hidden)
                tokens += len(response)
            done += len(batch)
            if on_progress:
                on_progress(done, len(prompts), tokens)
        store.write_shard(shard, [examples[i] for i in chunk])
    store.finish()
    return store


def describe_plan(target: Target, prompts: list[Prompt], params: SamplingParams, num_taps: int,
                  cache_budget_bytes: int) -> str:
    return plan_regeneration(target, tokenize_prompts(target, prompts, params), params, num_taps,
                             cache_budget_bytes).describe()
