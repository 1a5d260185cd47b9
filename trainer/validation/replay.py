"""Held-out acceptance without the target in the loop: greedy speculative decoding replayed against the
target's known greedy output.

Greedy speculative decoding is lossless, so its output is the target's own greedy continuation, and a
cycle's acceptance depends only on the drafter's drafts and that continuation. Decode each held-out
prompt with the target alone once, keep its continuation and the tapped hidden states of one forward pass
over it (`GreedyReference`), and any number of drafters can then be measured by running only the drafter:
the same cycles as `SpeculativeDecoder` (the drafting step is the decoder's own), with every verify pass
replaced by a comparison and the context features sliced from the stored taps. That makes held-out tau on
64+ prompts cheap enough to compare recipes, or to choose a checkpoint, with an interval (trainer/bootstrap.py
`bootstrap_interval`). The stored taps come from one pass instead of the decoder's incremental ones, so they can
differ in the last float bits: tests/trainer/test_replay.py checks equality with the decoder.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from schemas.sampling import SamplingParams
from trainer.data.prompts import Prompt
from trainer.drafter.model import Drafter, DrafterCache
from trainer.speculative import Cycle, SpeculativeDecoder
from trainer.targets.loading import Target
from trainer.validation import served_prompt_ids
from trainer.validation.acceptance import CategoryStats


@dataclass
class GreedyReference:
    prompt_id: str
    category: str
    prompt_len: int
    tokens: list[int]
    """Prompt then the target's greedy continuation (stop token included when one ended it)."""
    max_new_tokens: int
    taps: torch.Tensor
    """(len(tokens), layers * H) outputs of `tap_layer_ids`, one forward pass over `tokens`."""
    tap_layer_ids: tuple[int, ...]


@torch.inference_mode()
def greedy_references(target: Target, prompts: list[Prompt], params: SamplingParams, max_new_tokens: int,
                      tap_layer_ids: list[int]) -> list[GreedyReference]:
    """Decode every prompt greedily with the target alone and keep what a replay needs."""
    plain = SpeculativeDecoder(target)
    greedy = params.model_copy(update={"temperature": 0.0, "max_new_tokens": max_new_tokens})
    references = []
    for prompt, ids in zip(prompts, served_prompt_ids(target, prompts, greedy), strict=True):
        tokens = ids + plain.generate(ids, greedy).tokens
        _, taps = target.forward(torch.tensor([tokens], device=target.device), tap_layer_ids=list(tap_layer_ids))
        references.append(GreedyReference(prompt.id, prompt.category, len(ids), tokens, max_new_tokens,
                                          taps[0].float().cpu(), tuple(tap_layer_ids)))
    return references


@torch.inference_mode()
def reference_of(target: Target, prompt: Prompt, ids: list[int], response: list[int], max_new_tokens: int,
                 tap_layer_ids: list[int]) -> GreedyReference:
    """The replay reference of a known greedy `response` to `ids`: one target forward over both for the taps."""
    _, context = target.forward(torch.tensor([ids + response], device=target.device), tap_layer_ids=tap_layer_ids,
                                logits_to_keep=1)  # the taps are all a replay reads
    assert context is not None  # taps were asked for
    return GreedyReference(prompt.id, prompt.category, len(ids), ids + response, max_new_tokens,
                           context[0].float().cpu(), tuple(tap_layer_ids))


def save_references(references: list[GreedyReference], path: str | Path) -> None:
    import json

    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_file({f"taps{i}": r.taps.contiguous() for i, r in enumerate(references)}, path / "taps.safetensors")
    meta = [{k: getattr(r, k) for k in ("prompt_id", "category", "prompt_len", "tokens", "max_new_tokens",
                                        "tap_layer_ids")} for r in references]
    (path / "references.json").write_text(json.dumps(meta))


def load_references(path: str | Path) -> list[GreedyReference]:
    import json

    from safetensors.torch import load_file

    path = Path(path)
    taps = load_file(path / "taps.safetensors")
    return [GreedyReference(**{**m, "tap_layer_ids": tuple(m["tap_layer_ids"])}, taps=taps[f"taps{i}"])
            for i, m in enumerate(json.loads((path / "references.json").read_text()))]


@torch.inference_mode()
def replay_greedy(target: Target, drafter: Drafter, reference: GreedyReference, block_size: int | None = None,
                  stop_token_ids: list[int] | None = None, decoder: SpeculativeDecoder | None = None) -> list[Cycle]:
    """The cycles greedy speculative decoding of `reference`'s prompt goes through, drafter only."""
    decoder = decoder or SpeculativeDecoder(target, drafter, block_size, record_candidates=True)
    block = decoder.block_size
    stop = set(target.stop_token_ids() if stop_token_ids is None else stop_token_ids)
    width = reference.taps.shape[1] // len(reference.tap_layer_ids)
    columns = [reference.tap_layer_ids.index(i) for i in drafter.config.target_layer_ids]
    taps = reference.taps.view(len(reference.tokens), -1, width)[:, columns].flatten(1)
    taps = taps.to(device=target.device, dtype=target.dtype)[None]
    tokens, start = reference.tokens, reference.prompt_len
    max_length = start + reference.max_new_tokens
    greedy = SamplingParams(temperature=0.0)
    cache = DrafterCache(drafter.config.num_layers)
    context, context_start = taps[:, :start], 0
    cycles: list[Cycle] = []
    stopped = tokens[start] in stop
    while start + 1 < max_length and not stopped:
        verify = min(block, max_length - start)
        # The decoder's own drafting, its confidence-driven length (verify_length) included.
        drafts, _, candidates, scores, verify = decoder._draft_verified(tokens[start], start, verify, context,
                                                                        context_start, cache, greedy, None)
        truth = tokens[start + 1:start + verify]
        accepted = 0
        while accepted < len(truth) and drafts[accepted] == truth[accepted]:
            accepted += 1
        # Accepted drafts plus the target's token after them, cut as the decoder cuts them.
        new_tokens = tokens[start + 1:start + accepted + 2][:max_length - start - 1]
        for index, token in enumerate(new_tokens):
            if token in stop:
                new_tokens, stopped = new_tokens[:index + 1], True
                break
        cycles.append(Cycle(offered=verify - 1, accepted=accepted, emitted=len(new_tokens),
                            anchor_index=start - reference.prompt_len, candidates=candidates, scores=scores))
        context, context_start = taps[:, start:start + len(new_tokens)], start
        start += len(new_tokens)
    return cycles


@dataclass
class ReplayResult:
    stats: CategoryStats
    per_prompt: list[tuple[int, int]]
    """(tokens emitted, cycles) per reference, in order: the unit a bootstrap resamples."""

    @property
    def tau(self) -> float:
        return self.stats.overall.tau


def replay_acceptance(target: Target, drafter: Drafter, references: list[GreedyReference],
                      block_size: int | None = None) -> ReplayResult:
    decoder = SpeculativeDecoder(target, drafter.eval(), block_size, record_candidates=True)
    stats = CategoryStats(decoder.block_size)
    per_prompt = []
    for reference in references:
        cycles = replay_greedy(target, drafter, reference, decoder=decoder)
        stats.add(reference.category, reference.tokens[reference.prompt_len:], cycles)
        per_prompt.append((sum(c.emitted for c in cycles), len(cycles)))
    return ReplayResult(stats, per_prompt)
