"""Regeneration: the target answers every training prompt with the job's sampling parameters and chat
template, so the drafter learns the very distribution it will be verified against.

Prompts go through in left-padded batches with one KV cache per batch; finished rows leave the batch.
The tapped hidden states are captured during the same passes (no second target pass) and stored in
bfloat16 next to the tokens, unless the estimated cache exceeds the budget, in which case training
recomputes them. The target's own prediction of every response token (its top-k logits and final hidden
state) is kept too, for dense distillation. Work is cut into shards written atomically, so an interrupted run resumes at the
first missing shard, and several workers can each write some of one job's shards (a `ShardPlan`). Another
engine may write the responses instead of the built-in loop (a `ResponseBackend`); the target then captures
the hidden states in one teacher-forced pass.

A cancellation is seen within seconds, not at the end of a batch: the decode loop asks `should_stop` between
decode steps (at most once every POLL_SECONDS, since the hook may read a database), and progress moves with
the tokens generated against the planned ones (every prompt's max_new_tokens; a response that stopped early
counts its whole budget), not with batches finished. Neither touches a tensor or a random generator, so the
data are the same whether or not anyone asked.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from schemas.sampling import SamplingParams
from schemas.work_files import DataMeta
from trainer.data.prompts import Prompt
from trainer.data.store import DataStore, Example, TeacherSignal
from trainer.errors import DraftsmithError, StageInterrupted
from trainer.sampling import sample, seeded_generator, target_probs
from trainer.targets.chat import render_prompt
from trainer.targets.loading import Target

HIDDEN_DTYPE = torch.bfloat16
POLL_SECONDS = 1.0
"""Inside a batch, `should_stop` is asked and progress reported at most this often (between batches, always)."""
TEACHER_TOP_K = 32
"""Target logits kept per response token (with the target's final hidden state): the dense supervision a
distillation objective can use beyond the token itself (trainer/training/objective.py)."""


class DataError(DraftsmithError):
    """Regeneration cannot start or continue as asked."""

    code = "data_invalid"


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
        ids = render_prompt(target.tokenizer, list(prompt.messages), params.chat_template, prompt.tools)
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
                   generator: torch.Generator | None = None, teacher_top_k: int = 0,
                   on_step: Callable[[int, int], None] | None = None,
                   ) -> list[tuple[list[int], torch.Tensor | None, str, TeacherSignal | None]]:
    """Responses to a batch of tokenised prompts: (response ids, taps of prompt+response[:-1], stop reason,
    the target's own prediction of every response token when teacher_top_k > 0).

    Left padding keeps every row's newest token in the last column; positions count real tokens only.
    The teacher signal costs almost nothing here: the logits and the final hidden state of every step are
    computed anyway to pick the next token. `on_step(tokens, work)` follows every decode step that another
    forward pass follows: the response tokens generated so far, and the planned tokens done (`tokens` plus the
    unused budget of rows that stopped early; len(prompts) * max_new_tokens when the batch is done). It may
    raise (a cancellation) to end the batch there; it never touches a tensor or the generator.
    """
    recorder = TeacherRecorder(len(prompts), teacher_top_k, target.num_layers - 1) if teacher_top_k else None
    if recorder is not None:
        tap_layer_ids = recorder.with_final(tap_layer_ids)
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
    if recorder is not None:
        taps = recorder.split(taps)
    responses: list[list[int]] = [[] for _ in prompts]
    hidden: list[list[torch.Tensor]] = [[taps[i, width - len(p):]] if taps is not None else [] for i, p in enumerate(prompts)]
    reasons = ["length"] * len(prompts)
    next_pos = positions[:, -1] + 1
    generated = unused = 0  # response tokens so far; budget left unused by rows that stopped early
    for step in range(params.max_new_tokens):
        last = logits[:, -1]
        if recorder is not None:
            recorder.record(rows, last)
        tokens = last.argmax(-1) if params.greedy else sample(target_probs(last, params), generator)
        # The step's one host sync: the tokens and which of them stop, in one transfer; the rest is host-side.
        chosen, stopped = torch.stack([tokens, torch.isin(tokens, stop).to(tokens.dtype)]).tolist()
        for row, token, ends in zip(rows, chosen, stopped, strict=True):
            responses[row].append(token)
            if ends:
                reasons[row] = "stop"
        kept = [] if step + 1 == params.max_new_tokens else [live for live, ends in enumerate(stopped) if not ends]
        if not kept:
            break
        if on_step is not None:
            generated += len(rows)
            unused += (len(rows) - len(kept)) * (params.max_new_tokens - step - 1)
            on_step(generated, generated + unused)
        if len(kept) < len(rows):  # finished rows leave the batch and the cache
            keep = torch.tensor(kept).to(device, non_blocking=True)  # a blocking host-to-GPU copy would sync
            cache.batch_select_indices(keep)
            rows = [rows[i] for i in kept]
            tokens, attention, next_pos = tokens[keep], attention[keep], next_pos[keep]
        attention = torch.cat([attention, torch.ones_like(attention[:, :1])], dim=1)
        logits, taps = target.forward(tokens[:, None], next_pos[:, None], cache, tap_layer_ids,
                                      attention_mask=attention)
        if recorder is not None:
            taps = recorder.split(taps)
        next_pos = next_pos + 1
        if taps is not None:
            for live, row in enumerate(rows):
                hidden[row].append(taps[live])
    return [(responses[i], torch.cat(hidden[i]).to(HIDDEN_DTYPE) if hidden[i] else None, reasons[i],
             recorder.signal(i) if recorder is not None else None)
            for i in range(len(prompts))]


class TeacherRecorder:
    """Collects, step by step, the target's top-k logits and final (normed) hidden state for every live row.
    The final hidden state is tapped as the target's last layer (`Target.capture_taps`) and split off the
    ordinary taps before they are stored."""

    def __init__(self, rows: int, top_k: int, last_layer: int):
        self.top_k, self.last_layer = top_k, last_layer
        self.ids: list[list[torch.Tensor]] = [[] for _ in range(rows)]
        self.logits: list[list[torch.Tensor]] = [[] for _ in range(rows)]
        self.final: list[list[torch.Tensor]] = [[] for _ in range(rows)]
        self._taps: list[int] | None = None
        self._pending_final: torch.Tensor | None = None

    def with_final(self, tap_layer_ids: list[int] | None) -> list[int]:
        self._taps = tap_layer_ids
        return list(tap_layer_ids or []) + [self.last_layer]

    def split(self, taps: torch.Tensor) -> torch.Tensor | None:
        hidden = taps.shape[-1] // (len(self._taps or []) + 1)
        self._pending_final = taps[:, -1, -hidden:]  # the newest column predicts the next token
        return taps[..., :-hidden] if self._taps else None

    def record(self, rows: list[int], last_logits: torch.Tensor) -> None:
        values, ids = last_logits.float().topk(self.top_k, dim=-1)
        for live, row in enumerate(rows):
            self.ids[row].append(ids[live].to(torch.int32))
            self.logits[row].append(values[live])
            self.final[row].append(self._pending_final[live].to(HIDDEN_DTYPE))

    def signal(self, row: int) -> TeacherSignal:
        return TeacherSignal(torch.stack(self.ids[row]).cpu(), torch.stack(self.logits[row]).cpu(),
                             torch.stack(self.final[row]).cpu())


class ResponseBackend(Protocol):
    """An engine other than the built-in loop that writes the responses (trainer/data/vllm_backend.py). The
    target then reads each prompt + response once, teacher-forced, for its hidden states and teacher signal
    (trainer/data/capture.py), so the stored data has the same form whichever engine answered."""

    name: str
    seconds: float
    """The engine's own generation time so far (the stage's summary reports it)."""
    tokens: int
    """Response tokens it wrote so far."""

    def respond(self, prompt_ids: list[list[int]], params: SamplingParams, seed: int, *,
                should_stop: Callable[[], bool] | None = None) -> list[tuple[list[int], str]]:
        """(response ids, "stop" or "length") per prompt, sampled with `params` and `seed`. `should_stop` is
        asked while the engine works (it rate-limits itself): True ends the work there and raises
        StageInterrupted."""


class ShardPlan(Protocol):
    """Which shards this process generates, when one job's generation is spread over several workers
    (worker/shards.py claims them in the database). Without one, a process generates every missing shard."""

    def begin(self, sizes: list[int], files: list[list[Path]], max_new_tokens: int) -> None:
        """How this data set is cut: prompts per shard, and each shard's files in the order they are written (the
        parquet file, which marks the shard whole, last); every prompt plans max_new_tokens response tokens.
        Called once, before `claims`."""

    def claims(self, missing: list[int]) -> Iterator[int]:
        """The shards to generate here, one at a time (each claimed only when the previous one is written);
        `missing` are those not on this machine. May wait for shards other workers hold."""

    def progress(self, shard: int, prompts: int, tokens: int, fraction: float) -> None:
        """Prompts (of finished batches) and response tokens done so far in `shard`, and the fraction of its
        planned tokens done. Called between decode steps at most once every POLL_SECONDS, and after each batch."""

    def generated(self, shard: int, prompts: int, tokens: int, seconds: float) -> None:
        """`shard` is written, and on_saved has been called for its files."""

    def gather(self, missing: list[int]) -> bool:
        """Bring shards written elsewhere into the data directory (their files as `begin` named them). False:
        finishing the data set is another process's work (a helper), so stop here."""


class StopPoll:
    """`should_stop` asked at most once every `seconds` (always when forced): the decode loop's cancellation poll,
    cheap enough to call between decode steps however fast they are."""

    def __init__(self, should_stop: Callable[[], bool] | None, seconds: float = POLL_SECONDS):
        self.should_stop, self.seconds = should_stop, seconds
        self._asked_at = -math.inf

    def __call__(self, force: bool = False) -> bool:
        if self.should_stop is None:
            return False
        now = time.monotonic()
        if not force and now - self._asked_at < self.seconds:
            return False
        self._asked_at = now
        return bool(self.should_stop())


def regenerate(target: Target, prompts: list[Prompt], params: SamplingParams, out_dir: str | Path, *,
               tap_layer_ids: list[int], cache_budget_bytes: int = 4 << 30, shard_size: int = 64,
               batch_size: int = 16, on_progress: Callable[[int, int, int, float], None] | None = None,
               should_stop: Callable[[], bool] | None = None,
               on_saved: Callable[[Path], None] | None = None, teacher_top_k: int = TEACHER_TOP_K,
               shards: ShardPlan | None = None, backend: ResponseBackend | None = None,
               poll_seconds: float = POLL_SECONDS) -> DataStore | None:
    """Write the regenerated training set to `out_dir`; skip shards already complete. on_progress gets
    (prompts done, prompts total, tokens generated so far, fraction of the planned tokens done): after every
    batch, and between decode steps at most once every `poll_seconds`. `should_stop` is asked before every
    batch and between decode steps (at most once every `poll_seconds`; with a backend, while it works): True
    raises StageInterrupted, keeping every finished shard. `on_saved(path)` follows every file written (a
    shard's hidden states, then its parquet file, which marks it whole; the completion marker last), so a
    caller can copy finished work elsewhere as it appears. Returns None when `shards` leaves the rest of the
    data set to another process."""
    prompt_ids = tokenize_prompts(target, prompts, params)
    plan = plan_regeneration(target, prompt_ids, params, len(tap_layer_ids), cache_budget_bytes)
    meta = DataMeta.written(
        target_fingerprint=target.fingerprint, sampling=params.model_dump(mode="json"),
        tap_layer_ids=list(tap_layer_ids), hidden_cached=plan.cache_hidden,
        hidden_dtype=str(HIDDEN_DTYPE).removeprefix("torch."), shard_size=shard_size,
        prompt_ids=[p.id for p in prompts], plan=plan.describe(),
        **({"teacher_top_k": teacher_top_k} if teacher_top_k else {}))
    store = DataStore.create(out_dir, meta)
    saved = on_saved or (lambda path: None)
    saved(store.root / DataMeta.FILE)
    count = math.ceil(len(prompts) / shard_size)
    chunks = [range(i * shard_size, min(len(prompts), (i + 1) * shard_size)) for i in range(count)]
    done = sum(len(chunks[i]) for i in range(count) if store.has_shard(i))
    tokens = sum(store.shard_tokens(i) for i in range(count) if store.has_shard(i))
    missing = [i for i in range(count) if not store.has_shard(i)]
    poll = StopPoll(should_stop, poll_seconds)
    if shards is not None:
        shards.begin([len(chunk) for chunk in chunks], [store.shard_paths(i) for i in range(count)],
                     params.max_new_tokens)
    for shard in (shards.claims(missing) if shards is not None else missing):
        started = time.perf_counter()

        def report(prompts_done: int, shard_tokens: int, shard_work: int, shard: int = shard) -> None:
            planned = len(chunks[shard]) * params.max_new_tokens
            if shards is not None:
                shards.progress(shard, prompts_done, shard_tokens, shard_work / planned if planned else 1.0)
            if on_progress:
                whole = len(prompts) * params.max_new_tokens
                fraction = (done * params.max_new_tokens + shard_work) / whole if whole else 1.0
                on_progress(done + prompts_done, len(prompts), tokens + shard_tokens, fraction)

        examples, shard_tokens = _shard_examples(target, prompts, prompt_ids, chunks[shard], params, shard,
                                                 tap_layer_ids if plan.cache_hidden else None, batch_size,
                                                 teacher_top_k, backend, poll, report, f"{done} of {len(prompts)}")
        for path in store.write_shard(shard, examples):
            saved(path)
        done, tokens = done + len(examples), tokens + shard_tokens
        if shards is not None:
            shards.generated(shard, len(examples), shard_tokens, time.perf_counter() - started)
    missing = [i for i in range(count) if not store.has_shard(i)]
    if missing:
        if shards is None:
            raise DataError(f"shards {missing} of {store.root} are missing after generation")
        if not shards.gather(missing):
            return None
    store.finish()
    saved(store.root / "COMPLETE")
    return store


def _shard_examples(target: Target, prompts: list[Prompt], prompt_ids: list[list[int]], chunk: range,
                    params: SamplingParams, shard: int, taps: list[int] | None, batch_size: int, teacher_top_k: int,
                    backend: ResponseBackend | None, poll: StopPoll, report: Callable[[int, int, int], None],
                    done_before: str) -> tuple[list[Example], int]:
    """One shard's examples in prompt order, and its response tokens. The shard's seed is its index, so whichever
    process writes it, it is the same shard. `report(prompts done, tokens, planned tokens done)` follows every
    batch and, at most once every poll interval, decode steps; `poll` is asked before every batch (forced) and
    between decode steps (rate-limited)."""

    def interrupted(where: str) -> StageInterrupted:
        return StageInterrupted(f"generation stopped on request {where} after {done_before} prompts; finished "
                                "shards are kept and the stage resumes from them")

    generator = seeded_generator(params.seed * 100_003 + shard, target.device)
    # Similar lengths per batch waste less padding.
    order = sorted(chunk, key=lambda i: len(prompt_ids[i]))
    responses = None
    if backend is not None:
        if poll(force=True):
            raise interrupted("before its engine answered")
        responses = backend.respond([prompt_ids[i] for i in order], params, params.seed * 100_003 + shard,
                                    should_stop=poll)
    examples: dict[int, Example] = {}
    prompts_done = shard_tokens = 0
    reported_at = time.monotonic()
    for start in range(0, len(order), batch_size):
        if poll(force=True):
            raise interrupted("between batches")
        batch = order[start:start + batch_size]
        if responses is None:
            def on_step(tokens: int, work: int) -> None:
                nonlocal reported_at
                if poll():
                    raise interrupted("mid-batch")
                if time.monotonic() - reported_at >= poll.seconds:
                    reported_at = time.monotonic()
                    report(prompts_done, shard_tokens + tokens, prompts_done * params.max_new_tokens + work)

            outputs = generate_batch(target, [prompt_ids[i] for i in batch], params, taps, generator, teacher_top_k,
                                     on_step)
        else:
            from trainer.data.capture import capture_batch

            outputs = capture_batch(target, [prompt_ids[i] for i in batch], responses[start:start + len(batch)],
                                    taps, teacher_top_k)
        for i, (response, hidden, reason, teacher) in zip(batch, outputs, strict=True):
            examples[i] = Example(prompts[i].id, prompts[i].category, prompt_ids[i] + response, len(prompt_ids[i]),
                                  reason, hidden, teacher)
            shard_tokens += len(response)
        prompts_done += len(batch)
        reported_at = time.monotonic()
        report(prompts_done, shard_tokens, prompts_done * params.max_new_tokens)
    return [examples[i] for i in chunk], shard_tokens
