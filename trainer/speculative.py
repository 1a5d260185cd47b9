"""Speculative decoding with a DFlash drafter: draft a block, verify it with one target pass, keep the
longest accepted prefix plus one target token. Batch size 1.

The loop follows the reference `dflash.model.dflash_generate` step for step (same verify sizes, same
acceptance counting, same stop handling), so both give identical tokens and acceptance lengths in greedy
mode. Without a drafter (or with block size 1) the same loop is plain autoregressive decoding of the
target, which is what losslessness is checked against; with `verify_width` it is the same decoding with every
forward as wide as a verify (the reference of the greedy check on bfloat16 targets, trainer/validation/report.py).

With `verify_length` (trainer/confidence.py `VerifyLength`) the drafter still drafts the whole block, and the cycle
verifies only the drafts whose calibrated acceptance pays for their verify cost: a confidence-driven draft length.
It stays lossless at T = 0 (a shorter block is still verified against the target's argmax) and exact under sampling
(`_draft_verified`'s comment says why).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import torch

from schemas.sampling import SamplingParams
from trainer.confidence import VerifyLength
from trainer.device import synchronize
from trainer.drafter.model import Drafter, DrafterCache
from trainer.sampling import filtered_probs, rejection_sample, sample, target_probs
from trainer.targets.loading import Target


@dataclass(frozen=True)
class Cycle:
    """One draft-verify cycle."""

    offered: int
    """Drafts put up for verification (block length - 1)."""
    accepted: int
    """Drafts the target accepted."""
    emitted: int
    """Tokens committed by the cycle, bonus included, after stop/max-token truncation. Its mean is tau."""
    anchor_index: int = 0
    """Index in the generated tokens of the cycle's anchor; drafts k = 1.. stand for anchor_index + k."""
    candidates: tuple[tuple[int, ...], ...] | None = None
    """With record_candidates: the drafter's top-K tokens at every drafted position (for oracle tau)."""
    scores: tuple[float, ...] | None = None
    """With record_scores or verify_length: the drafter's confidence score at every drafted position, offered or not
    (`Drafter.confidence`); a confidence map is fitted on (score, accepted) of the positions a cycle reached."""


@dataclass
class DecodeResult:
    tokens: list[int]
    """Generated tokens (the prompt excluded), the stop token included when one ended the response."""
    cycles: list[Cycle] = field(default_factory=list)
    stop_reason: str = "length"
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0

    @property
    def acceptance_lengths(self) -> list[int]:
        return [cycle.emitted for cycle in self.cycles]

    @property
    def tau(self) -> float:
        """Mean tokens per target verify pass (bonus counted), as SGLang and the reference report it."""
        return sum(self.acceptance_lengths) / max(len(self.cycles), 1)


@dataclass
class Prefill:
    """The target's pass over one prompt, kept to start many decodes of that prompt (the sampling test draws
    hundreds of continuations of each prompt; each decode starts from a copy, so none sees another's tokens)."""

    prompt_ids: tuple[int, ...]
    cache: object
    logits: torch.Tensor
    """The target's logits after the last prompt token."""
    context: torch.Tensor | None
    """The prompt's tapped features (the drafter's first context), None without a drafter."""


class SpeculativeDecoder:
    def __init__(self, target: Target, drafter: Drafter | None = None, block_size: int | None = None,
                 record_candidates: bool = False, use_draft_vocab: bool = True, verify_width: int = 1,
                 record_scores: bool = False, verify_length: VerifyLength | None = None):
        self.target = target
        self.record_scores = record_scores or verify_length is not None
        self.verify_length = verify_length
        # The least width of every target forward (the block, or the token, then copies of its first token whose
        # logits are dropped and whose cache entries are cropped), so the target alone runs at a verify's shapes
        # and a verify near the end of the answer keeps its full width.
        self.verify_width = verify_width
        self.drafter = drafter
        self.record_candidates = record_candidates
        default_block = drafter.config.block_size if drafter is not None else 1
        self.block_size = block_size or default_block
        if self.block_size > 1 and drafter is None:
            raise ValueError("block_size > 1 needs a drafter")
        # Drafting over a draft vocabulary: the LM head's rows for it, sliced once. Verification always
        # uses the full vocabulary, so this changes the drafts' cost and quality, never the output.
        vocab = getattr(drafter, "draft_vocab", None) if use_draft_vocab else None
        self.draft_vocab = None if vocab is None else vocab.to(target.device)
        self.draft_head = None if vocab is None else target.lm_head.weight[self.draft_vocab].contiguous()

    @torch.inference_mode()
    def prefill(self, prompt_ids: list[int]) -> Prefill:
        """The target's pass over the prompt, capturing the drafter's taps."""
        cache = self.target.new_cache()
        logits, context = self.target.forward(
            torch.tensor([prompt_ids], device=self.target.device), self._positions(0, len(prompt_ids)),
            cache=cache, tap_layer_ids=self._tap_ids(), logits_to_keep=1,
        )
        return Prefill(tuple(prompt_ids), cache, logits[0, -1], context)

    @torch.inference_mode()
    def generate(self, prompt_ids: list[int], params: SamplingParams, *, max_new_tokens: int | None = None,
                 stop_token_ids: list[int] | None = None, generator: torch.Generator | None = None,
                 prefill: Prefill | None = None) -> DecodeResult:
        """Decode one response. `prefill`: a kept `self.prefill(prompt_ids)` to start from (copied, never
        changed) instead of running the prompt through the target again."""
        target, device = self.target, self.target.device
        prompt_len = len(prompt_ids)
        max_length = prompt_len + (max_new_tokens or params.max_new_tokens)
        stop = set(target.stop_token_ids() if stop_token_ids is None else stop_token_ids)
        taps = self._tap_ids()
        drafter_cache = DrafterCache(self.drafter.config.num_layers) if self.block_size > 1 else None

        synchronize(device)  # the clocks measure this decode's kernels, not work queued before it
        started = time.perf_counter()
        if prefill is None:
            prefill = self.prefill(prompt_ids)
            target_cache = prefill.cache
        elif prefill.prompt_ids != tuple(prompt_ids) or (prefill.context is None) != (taps is None):
            raise ValueError("the prefill was made for another prompt or another decoder")
        else:
            target_cache = copy.deepcopy(prefill.cache)
        context = prefill.context
        tokens = list(prompt_ids) + [self._choose(prefill.logits, params, generator)]
        context_start = 0
        synchronize(device)
        result = DecodeResult(tokens=[], prefill_seconds=time.perf_counter() - started)

        started = time.perf_counter()
        start = prompt_len  # position of the anchor: the newest token, not yet seen by the target
        stopped = tokens[start] in stop
        while start + 1 < max_length and not stopped:
            verify = min(self.block_size, max_length - start)
            drafting = verify > 1  # the drafter ran: its context must follow the committed tokens
            block, proposal, candidates, scores = [tokens[start]], None, None, None
            if drafting:
                drafts, proposal, candidates, scores, verify = self._draft_verified(
                    tokens[start], start, verify, context, context_start, drafter_cache, params, generator)
                block += drafts
            # Every forward at least `verify_width` wide to the end of the answer, as a served verify is: bfloat16
            # rounding depends on the width, so neither decoder may narrow where the other does not.
            width = max(verify, self.verify_width)
            mark = target.mark(target_cache)
            logits, taps_out = target.forward(
                torch.tensor([block + block[:1] * (width - len(block))], device=device), self._positions(start, width),
                cache=target_cache, tap_layer_ids=taps if drafting else None,
            )
            accepted, bonus = self._verify(block, logits[0, :len(block)], proposal, params, generator)
            new_tokens = (block[1:1 + accepted] + [bonus])[:max_length - start - 1]
            for index, token in enumerate(new_tokens):
                if token in stop:
                    new_tokens, stopped = new_tokens[:index + 1], True
                    break
            tokens.extend(new_tokens)
            result.cycles.append(Cycle(offered=verify - 1, accepted=accepted, emitted=len(new_tokens),
                                       anchor_index=start - prompt_len,
                                       candidates=candidates, scores=scores))
            if drafting:
                # Features of the committed tokens (anchor and accepted drafts) become new drafter context.
                context, context_start = taps_out[:, :len(new_tokens)], start
            # The cache keeps the anchor and the accepted drafts; a recurrent state is put back exactly.
            target.rewind(target_cache, mark, tokens[start:start + len(new_tokens)])
            start += len(new_tokens)
        synchronize(device)
        result.decode_seconds = time.perf_counter() - started
        result.tokens = tokens[prompt_len:max_length]
        result.stop_reason = "stop" if stopped else "length"
        return result

    def _tap_ids(self) -> list[int] | None:
        """The target layers whose outputs feed the drafter; None when decoding without one."""
        return list(self.drafter.config.target_layer_ids) if self.block_size > 1 else None

    def _positions(self, start: int, length: int) -> torch.Tensor:
        return torch.arange(start, start + length, device=self.target.device)[None]

    def _choose(self, logits: torch.Tensor, params: SamplingParams, generator) -> int:
        if params.greedy:
            return int(logits.argmax())
        return int(sample(target_probs(logits, params), generator))

    def _draft_verified(self, anchor: int, start: int, verify: int, context: torch.Tensor, context_start: int,
                        cache: DrafterCache, params: SamplingParams, generator):
        """Draft a block of `verify` and keep the drafts this cycle verifies: (drafts, proposal, candidates, scores,
        the verify length, anchor included). All of them, unless the decoder has a `verify_length`."""
        if not self.record_scores:
            drafts, proposal, candidates = self._draft(anchor, start, verify, context, context_start, cache, params,
                                                       generator)
            return drafts, proposal, candidates, None, verify
        drafts, proposal, candidates, scores = self._draft_scored(anchor, start, verify, context, context_start,
                                                                  cache, params, generator)
        if self.verify_length is None:
            return drafts, proposal, candidates, scores, verify
        # Exact under sampling: the rule stops before draft k+1 from the scores of positions 1..k+1, and the score
        # at k+1 reads only drafts 1..k (its predecessor), never draft k+1 itself, nor any target logit. So whether
        # draft k+1 is verified is decided before it is drawn, as far as its distribution goes: given drafts 1..k,
        # draft k+1 is still a draw from q, and position k+1 yields the target's p whether it is offered (rejection
        # sampling) or not (the bonus token, drawn from p). A rule that read a later position's score, or the drawn
        # token's own probability, would select drafts by their value and bias the output.
        offered = self.verify_length.choose(scores)
        return (drafts[:offered], None if proposal is None else proposal[:offered],
                candidates and candidates[:offered], scores, offered + 1)

    def _draft(self, anchor: int, start: int, verify: int, context: torch.Tensor, context_start: int,
               cache: DrafterCache, params: SamplingParams, generator):
        """Draft verify - 1 tokens: (drafts, their proposal distributions or None when greedy,
        the top-K candidates per position when recording them)."""
        return self._draft_scored(anchor, start, verify, context, context_start, cache, params, generator,
                                  scored=False)[:3]

    def _draft_scored(self, anchor: int, start: int, verify: int, context: torch.Tensor, context_start: int,
                      cache: DrafterCache, params: SamplingParams, generator, scored: bool = True):
        """`_draft`'s three, and the drafts' confidence scores (a tuple, None when not `scored`)."""
        target, drafter = self.target, self.drafter
        assert drafter is not None  # the constructor refuses a block size over 1 without one
        block_ids = torch.full((1, verify), drafter.config.mask_token_id, device=target.device)
        block_ids[0, 0] = anchor
        hidden = drafter(
            drafter.embed_block(block_ids, target.embedding_weight), self._positions(start, verify), context,
            self._positions(context_start, context.shape[1]), cache=cache,
        )[:, 1:]
        vocab = self.draft_vocab
        logits = target.lm_head(hidden) if vocab is None else hidden @ self.draft_head.T
        top_k = None
        if self.record_candidates:
            indices = logits[0].topk(drafter.config.selector_top_k, dim=-1).indices
            top_k = tuple(map(tuple, (indices if vocab is None else vocab[indices]).tolist()))
        full_vocab = target.vocab_size
        anchor_ids = block_ids[:, 0]
        if drafter.candidate_selector is not None:
            drafts, candidates, q = drafter.propose(hidden, logits, anchor_ids, params.temperature, generator, vocab)
            scores = drafter.confidence(hidden, logits, anchor_ids, drafts, vocab) if scored else None
            if q is not None:
                q = torch.zeros(q.shape[1], full_vocab, dtype=q.dtype, device=q.device).scatter(-1, candidates[0], q[0])
            return drafts[0].tolist(), q, top_k, _scores(scores)
        scores = drafter.confidence(hidden, logits, anchor_ids, logits.argmax(-1)) if scored else None
        if params.greedy:
            drafts = logits[0].argmax(-1)
            return (drafts if vocab is None else vocab[drafts]).tolist(), None, top_k, _scores(scores)
        q = filtered_probs(logits[0], params.temperature, params.top_p, params.top_k)
        drafts = sample(q, generator)
        if vocab is None:
            return drafts.tolist(), q, top_k, _scores(scores)
        # A proposal over the draft vocabulary is a proposal over the whole one that is 0 elsewhere.
        q = torch.zeros(q.shape[0], full_vocab, dtype=q.dtype, device=q.device).index_copy(-1, vocab, q)
        return vocab[drafts].tolist(), q, top_k, _scores(scores)

    def _verify(self, block: list[int], logits: torch.Tensor, proposal, params: SamplingParams,
                generator) -> tuple[int, int]:
        """(drafts accepted, the target's token after them)."""
        drafts = torch.tensor(block[1:], device=logits.device)
        if params.greedy:
            posterior = logits.argmax(-1)
            accepted = int((drafts == posterior[:-1]).int().cumprod(0).sum())
            return accepted, int(posterior[accepted])
        p = target_probs(logits, params)
        if len(block) == 1:
            return 0, int(sample(p[0], generator))
        return rejection_sample(drafts, p, proposal, generator)


def _scores(scores: torch.Tensor | None) -> tuple[float, ...] | None:
    return None if scores is None else tuple(scores[0].tolist())
