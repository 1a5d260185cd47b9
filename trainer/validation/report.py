"""`draftsmith validate`: prove a drafter lossless on held-out prompts and measure what it buys.

Sized to cost little more than the drafter is worth measuring (~4 minutes on two CPU cores at the
defaults), and proportional to the job's validation settings:

1. The target answers every validation prompt once, in batches (`trainer/data/regenerate.py`'s loop); its
   greedy output is the reference. Acceptance at the trained block size is replayed against it
   (trainer/validation/replay.py: the drafter runs, the target does not): tau at T=0. Sampling jobs also measure
   it with the real decoder at their own temperature, top-p and top-k (trainer/validation/sampled_acceptance.py),
   and their headline figures are those; a greedy job's figure at its own temperature is the T=0 one, measured
   once. Both go into report.json (`tau_greedy`, `tau_sampled`) with a 95 % bootstrap interval over prompts.
2. The draft and verify costs of every draft length, with the acceptance, give the recommended length. The T=0
   replay's (score, accepted) pairs give the drafter's calibrated confidence, and the adaptive length is replayed
   against that length (trainer/validation/confidence_report.py: report.json `confidence`).
3. On a timed subset (a third of the prompts, one per category at the defaults), each prompt is decoded at
   batch 1 by the target alone and then speculatively at that length, back to back, so both see the same
   machine load: the measured speedup, with a bootstrap interval over those prompts. The speculative output
   must equal the target's token for token (any mismatch fails, with the first diverging position): the greedy
   gate, below. On a GPU every validation prompt is decoded speculatively and checked, not only the timed ones.
4. A statistical test of speculative sampling at that length against the target's exact distribution
   (trainer/validation/sampling_test.py), sized by the job's `sampling_draws`. A test that could test nothing
   is "inconclusive", never "passed": it fails a sampling job, and a greedy job's report says so.

The greedy gate, and what "identical" means in bfloat16 (report.json `greedy_gate`). In float32 (every CPU run, and
a GPU job with `compute.dtype: float32`) the reference is the target alone decoding one token per forward, as
always. In bfloat16 a forward's rounding depends on its shapes: one token at a time and an 8-token verify can round
a near-tie differently, so "equal to the target alone" would depend on the kernels, not the drafter. There the
reference is the target's own greedy decode run at the shapes the serving engine's verify uses: every forward is as
wide as the served block (the token, then copies whose logits are dropped and whose cache is cropped:
`SpeculativeDecoder(verify_width=)`), one token committed per forward, and the speculative decode's verifies keep
that full width to the end of the answer too, as a serving engine's do. The speculative output must equal that token
for token. One case is told apart, never passed silently: where the outputs first differ, if the two tokens' logits
(the target's, recomputed there) are both within NEAR_TIE_ULPS units of bfloat16's resolution of the top logit, the
two decodes rounded a tie differently; the prompt is reported under `near_ties` (with the logits' gap) instead of
counting as a mismatch. Any other difference fails the job. In float32 there is no such case: any difference fails.
A job that needs equality with the plain one-token decode asks for float32.

`on_progress(done, total)` is called between every unit of work (a batch, a prompt, a block size, a draw
group), so a caller can stop validation within seconds by raising from it.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Mapping

import torch

from schemas.sampling import SamplingParams
from schemas.validation_plan import REFERENCE_BATCH, SAMPLED_TOKENS_PER_DRAW, gated_prompt_count, timed_prompt_count
from schemas.validation_report import REPORT_VERSION, ServingMode, ValidationReport
from trainer.bootstrap import bootstrap_interval
from trainer.data.prompts import Prompt
from trainer.device import DevicePlan, plan_of, synchronize
from trainer.drafter.model import Drafter, DrafterCache
from trainer.errors import DraftsmithError
from trainer.speculative import SpeculativeDecoder
from trainer.targets.loading import Target
from trainer.validation import (
    RENDERED_BY,
    SAMPLING_DRAWS,
    SAMPLING_PROMPTS,
    VALIDATION_MAX_NEW_TOKENS,
    served_prompt_ids,
)
from trainer.validation.acceptance import AcceptanceStats, CategoryStats
from trainer.validation.confidence_report import confidence_figures
from trainer.validation.replay import reference_of, replay_greedy
from trainer.validation.sampled_acceptance import (
    GREEDY_REPLAY,
    SPECULATIVE_SAMPLING,
    MeasuredAcceptance,
    parent_comparison,
    sampled_acceptance,
    tau_figures,
)
from trainer.validation.sampling_test import sampling_lossless_test

SAMPLING_ALPHA = 1e-3
NEAR_TIE_ULPS = 2
"""How close (in units of the dtype's resolution at the top logit's magnitude) a differing token's logit must be to
the top one for a bfloat16 divergence to be a rounding tie rather than a mismatch."""


class ValidationFailed(DraftsmithError):
    """The drafter changed the target's output: never publish it."""

    code = "not_lossless"


class SamplingInconclusive(DraftsmithError):
    """A sampling job's distribution test had too few draws to test anything."""

    code = "validation_inconclusive"


def check_compatible(target: Target, drafter: Drafter) -> None:
    """Refuse a drafter built for another target, naming what differs."""
    c = drafter.config
    problems = []
    if c.hidden_size != target.hidden_size:
        problems.append(f"hidden size {c.hidden_size} != target's {target.hidden_size}")
    if c.vocab_size != target.vocab_size:
        problems.append(f"vocabulary {c.vocab_size} != target's {target.vocab_size}")
    if c.num_target_layers != target.num_layers or max(c.target_layer_ids) >= target.num_layers:
        problems.append(f"taps layers {list(c.target_layer_ids)} of a {c.num_target_layers}-layer target; "
                        f"this target has {target.num_layers} layers")
    if not problems and c.target_fingerprint and c.target_fingerprint != target.fingerprint:
        problems.append(f"target fingerprint {c.target_fingerprint} != {target.fingerprint} "
                        "(different tokenizer or embedding)")
    if problems:
        raise DraftsmithError("the drafter was built for another target: " + "; ".join(problems))


Progress = Callable[[int, int, str], None]
"""(units done, units in all, what is being done): the units are batches, prompts, block sizes and draws."""


class _Progress:
    """Counts units of work against a total fixed up front, and forwards each to the caller's callback."""

    def __init__(self, total: int, callback: Progress | None):
        self.done, self.total, self.callback = 0, total, callback

    def step(self, units: int = 1, detail: str = "") -> None:
        self.done += units
        if self.callback:
            self.callback(min(self.done, self.total), self.total, detail)


@torch.inference_mode()
def greedy_outputs(target: Target, rendered: list[list[int]], max_new_tokens: int,
                   progress: _Progress | None = None) -> list[list[int]]:
    """The target's greedy answer to every prompt, REFERENCE_BATCH prompts at a time."""
    from trainer.data.regenerate import generate_batch

    progress = progress or _Progress(len(rendered), None)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    outputs: list[list[int]] = []
    for start in range(0, len(rendered), REFERENCE_BATCH):
        batch = rendered[start:start + REFERENCE_BATCH]
        outputs += [response for response, *_ in generate_batch(target, batch, greedy, None)]
        progress.step(len(batch), f"the target alone answered {len(outputs)}/{len(rendered)} prompts (batched)")
    return outputs


def validate(target: Target, drafter: Drafter, prompts: list[Prompt], params: SamplingParams, *,
             max_new_tokens: int = VALIDATION_MAX_NEW_TOKENS, sampling_draws: int = SAMPLING_DRAWS,
             sampling_prompts: int = SAMPLING_PROMPTS,
             on_progress: Progress | None = None, device_plan: DevicePlan | None = None,
             parent: Drafter | None = None) -> ValidationReport:
    """The validation report of `drafter` on `prompts` (module docstring: what is measured, and how), as
    report.json's model (schemas/validation_report.py; `.to_json()` is the file's object). `device_plan`: where the
    target was loaded (trainer/device.py); None: read off the target. `parent`: a warm start's (`before_and_after`)."""
    check_compatible(target, drafter)
    block_size = drafter.config.block_size
    greedy = params.model_copy(update={"temperature": 0.0, "max_new_tokens": max_new_tokens})
    timed = timed_prompt_count(len(prompts))
    every_prompt = target.device.type == "cuda"  # a GPU decodes them all speculatively in little time
    gated = gated_prompt_count(len(prompts), every_prompt=every_prompt)
    sampled_prompts = min(sampling_prompts, len(prompts))
    # Units: reference prompts, acceptance prompts (again at a sampling job's T), block sizes, gated, sampling prompts.
    acceptance = len(prompts) * (1 if params.greedy else 2) * (1 if parent is None else 2)  # again for a parent
    progress = _Progress(len(prompts) + acceptance + block_size + gated + sampled_prompts, on_progress)
    rendered = served_prompt_ids(target, prompts, greedy)
    references = greedy_outputs(target, rendered, max_new_tokens, progress)
    at_zero, at_job = measure_acceptance(target, drafter, prompts, rendered, references, params, max_new_tokens,
                                         progress)
    parent_figures = None if parent is None else before_and_after(target, parent, prompts, rendered, references, params,
                                                              max_new_tokens, progress, (at_zero, at_job), block_size)
    overall: AcceptanceStats = (stats := (at_job or at_zero).stats).overall  # headline: at the job's parameters
    costs = measure_step_costs(target, drafter, rendered[0],
                               on_each=lambda: progress.step(detail="draft and verify cost per block size"))
    expected_tau, speedups, recommended = recommend_block_size(overall, costs, block_size)
    confidence = confidence_figures(target, drafter, prompts, rendered, references, at_zero, costs, recommended,
                                    max_new_tokens)

    gate = greedy_gate(target, recommended, gated, every_prompt)
    served = SpeculativeDecoder(target, drafter, block_size=recommended, verify_width=gate["verify_width"])
    reference = SpeculativeDecoder(target, verify_width=gate["verify_width"]) if gate["verify_width"] > 1 else None
    speed, greedy_check = timed_decoding(target, served, prompts[:gated], rendered[:gated], greedy, progress,
                                         timed=timed, reference=reference)

    sampling_params = params if not params.greedy else params.model_copy(update={"temperature": 1.0})
    sampling = sampling_lossless_test(served, rendered[:sampled_prompts], sampling_params, draws=sampling_draws,
                                      tokens=SAMPLED_TOKENS_PER_DRAW, seed=params.seed,
                                      on_progress=lambda prompts: progress.step(prompts, "speculative-sampling test"))
    sampling_passed = sampling["status"] == "tested" and sampling["p_value"] >= SAMPLING_ALPHA
    if sampling["status"] == "tested":
        sampling["status"] = "passed" if sampling_passed else "failed"
    # Greedy serving is proven by the exact match; the sampling test then checks the decoder at T=1 too, and an
    # inconclusive one is reported as such. A sampling job's proof *is* that test.
    lossless = greedy_check["mismatches"] == 0 and (sampling_passed or (params.greedy and
                                                                        sampling["status"] == "inconclusive"))
    return ValidationReport(
        version=REPORT_VERSION,
        passed=lossless,
        block_size=block_size,
        tau=round(overall.tau, 4),
        **tau_figures(at_zero.per_prompt, at_job and at_job.per_prompt, params, block_size=block_size),
        tau_per_position=[None if a is None else round(a, 4) for a in overall.per_position],
        acceptance_by_position=overall.by_position(),
        acceptance_by_category=stats.acceptance_by_category(),
        oracle_tau=None if overall.oracle_tau is None else round(overall.oracle_tau, 4),
        cycles=overall.cycles,
        acceptance_measured_by=GREEDY_REPLAY if params.greedy else SPECULATIVE_SAMPLING,
        prompts=len(prompts),
        expected_tau_by_block_size=expected_tau,
        recommended_block_size=recommended,
        estimated_speedup_by_block_size={b: round(v, 3) for b, v in speedups.items()},
        step_costs_ms=step_costs_figure(costs),
        lossless={
            "greedy": {**greedy_check, "block_size": recommended},
            "sampling": {**sampling, "alpha": SAMPLING_ALPHA, "passed": sampling_passed, "block_size": recommended},
        },
        speedup=speed,
        serving_advice=serving_advice(speed, recommended),
        sampling_parameters=params.model_dump(mode="json"),
        validation_max_new_tokens=max_new_tokens,
        target_fingerprint=target.fingerprint,
        device=(device_plan or plan_of(target.device, target.dtype)).describe(),
        greedy_gate=gate,
        serving_mode=ServingMode.of(params.model_dump(mode="json"), RENDERED_BY),
        **({} if parent_figures is None else {"warm_start": parent_figures}),
        **({} if confidence is None else {"confidence": confidence}),
    )


def recommend_block_size(overall: AcceptanceStats, costs: dict, block_size: int) -> tuple[dict, dict, int]:
    """(expected tau by block size, the speedup each implies at the measured step costs, the best block size)."""
    expected_tau = {b: round(overall.expected_tau(b), 4) for b in range(2, block_size + 1)}
    speedups = {b: expected_tau[b] * costs["verify"][1] / (costs["draft"][b] + costs["verify"][b])
                for b in expected_tau}
    return expected_tau, speedups, max(speedups, key=speedups.get)


def before_and_after(target: Target, parent: Drafter, prompts: list[Prompt], rendered: list[list[int]],
                     references: list[list[int]], params: SamplingParams, max_new_tokens: int, progress: _Progress,
                     new: tuple[MeasuredAcceptance, MeasuredAcceptance | None], block_size: int) -> dict:
    """report.json's `warm_start`: the parent measured in the same serving mode, on the same rendered prompts,
    greedy references and seeds as the new drafter's `new` (at T=0, at the job's parameters), and the two paired."""
    check_compatible(target, parent)
    parent_zero, parent_job = measure_acceptance(target, parent, prompts, rendered, references, params,
                                                 max_new_tokens, progress, who="the parent's acceptance")
    comparison = parent_comparison(*new, parent_zero, parent_job, params, block_size=block_size,
                                   parent_block_size=parent.config.block_size)
    return {**comparison, "serving_mode": ServingMode.of(params.model_dump(mode="json"), RENDERED_BY)}


def step_costs_figure(costs: dict) -> dict:
    """report.json's `step_costs_ms` from `measure_step_costs`' seconds."""
    return {"verify": {b: round(v * 1000, 2) for b, v in costs["verify"].items()},
            "draft": {b: round(v * 1000, 2) for b, v in costs["draft"].items()},
            "draft_vocab_size": costs["draft_vocab_size"], "repeats": costs["repeats"],
            "threads": torch.get_num_threads()}


def greedy_gate(target: Target, block_size: int, prompts: int, every_prompt: bool) -> dict:
    """What the greedy exact-match check compares, for report.json (module docstring: the bfloat16 definition)."""
    dtype = str(target.dtype).removeprefix("torch.")
    exact = target.dtype == torch.float32
    return {
        "dtype": dtype, "device": target.device.type, "prompts": prompts, "every_prompt": every_prompt,
        "block_size": block_size, "verify_width": 1 if exact else block_size,
        "reference": ("the target alone, greedy, one token per forward" if exact else
                      f"the target's own greedy decode with every forward {block_size} tokens wide (the served "
                      f"verify's shapes), one token committed per forward: {dtype} rounding depends on shapes, so "
                      "this, not the one-token decode, is the target's output at serving time; ask for "
                      "compute.dtype float32 to compare with the one-token decode"),
    }


def measure_acceptance(target: Target, drafter: Drafter, prompts: list[Prompt], rendered: list[list[int]],
                       references: list[list[int]], params: SamplingParams, max_new_tokens: int,
                       progress: _Progress | None = None, who: str = "acceptance") -> tuple[MeasuredAcceptance,
                                                                                    MeasuredAcceptance | None]:
    """Acceptance at the trained block size: (at T=0, replayed against the references; at the job's own sampling
    parameters, sampled with the real decoder, or None for a greedy job, whose figure is the T=0 one). Replay runs
    the drafter, not the target's verify passes: a sampling job's T=0 figure costs about a quarter of its sampled one
    and decodes no target token (validation_plan's token counts hold)."""
    progress = progress or _Progress(len(prompts) * 2, None)
    greedy = MeasuredAcceptance(CategoryStats(drafter.config.block_size))
    decoder = SpeculativeDecoder(target, drafter, record_candidates=True, record_scores=True)  # scores: the map's
    taps = list(drafter.config.target_layer_ids)
    for index, (prompt, ids, response) in enumerate(zip(prompts, rendered, references, strict=True)):
        reference = reference_of(target, prompt, ids, response, max_new_tokens, taps)
        greedy.add(prompt.category, response, replay_greedy(target, drafter, reference, decoder=decoder))
        progress.step(detail=f"{who} at T=0 on {index + 1}/{len(prompts)} prompts")
    if params.greedy:
        return greedy, None
    serving = params.model_copy(update={"max_new_tokens": max_new_tokens})

    def each(index: int) -> None:
        progress.step(detail=f"{who} at T={params.temperature} on {index + 1}/{len(prompts)} prompts")

    return greedy, sampled_acceptance(target, drafter, prompts, serving, rendered=rendered, on_each=each)


def timed_decoding(target: Target, served: SpeculativeDecoder, prompts: list[Prompt], rendered: list[list[int]],
                   greedy: SamplingParams, progress: _Progress, *, timed: int | None = None,
                   reference: SpeculativeDecoder | None = None) -> tuple[dict, dict]:
    """The first `timed` prompts (None: all) decoded by the target alone and then speculatively, back to back (the
    speedup figures), and every prompt's speculative output checked token for token against `reference`'s (None:
    the target alone's): (the speedup figures, the greedy exact-match check)."""
    plain = SpeculativeDecoder(target)
    timed = len(prompts) if timed is None else min(timed, len(prompts))
    served_stats = AcceptanceStats(served.block_size)
    per_prompt: list[tuple[float, float, int]] = []  # (seconds alone, seconds speculative, tokens)
    mismatches, first_divergence, checked_tokens, near_ties = 0, None, 0, []
    load_before = os.getloadavg()[0]
    for index, (prompt, ids) in enumerate(zip(prompts, rendered, strict=True)):
        alone = plain.generate(ids, greedy) if index < timed or reference is None else None
        got = served.generate(ids, greedy)
        expected = alone if reference is None else reference.generate(ids, greedy)
        if index < timed:
            per_prompt.append((alone.prefill_seconds + alone.decode_seconds,
                               got.prefill_seconds + got.decode_seconds, len(alone.tokens)))
            served_stats.add(got.tokens, got.cycles)
        checked_tokens += len(expected.tokens)
        if got.tokens != expected.tokens:
            position = next((i for i, (a, b) in enumerate(zip(got.tokens, expected.tokens)) if a != b),
                            min(len(got.tokens), len(expected.tokens)))
            # float32 is exact: no divergence there is a rounding tie.
            tie = (None if target.dtype == torch.float32
                   else near_tie(target, ids, expected.tokens, got.tokens, position))
            if tie is not None:
                checked_tokens -= len(expected.tokens) - position  # the rest follows a different token
                near_ties.append({"prompt_id": prompt.id, "position": position, **tie})
            else:
                mismatches += 1
            if tie is None and first_divergence is None:
                first_divergence = {"prompt_id": prompt.id, "position": position,
                                    "expected": expected.tokens[position:position + 5],
                                    "got": got.tokens[position:position + 5]}
        what = "timed decoding, target alone vs speculative" if index < timed else "greedy check, speculative"
        progress.step(detail=f"{what}: {index + 1}/{len(prompts)} prompts")
    alone_s, spec_s, tokens = (sum(column) for column in zip(*per_prompt, strict=True))
    ratio = alone_s / spec_s
    speed = {
        "decoding": f"greedy, batch 1, block size {served.block_size} (recommended), {timed} prompts each "
                    "decoded by the target alone then speculatively, back to back, on this machine",
        "block_size": served.block_size, "prompts": timed,
        "tau": round(served_stats.tau, 4),
        "ar_tokens_per_s": round(tokens / alone_s, 2), "spec_tokens_per_s": round(tokens / spec_s, 2),
        "ratio": round(ratio, 3),  # the speedup is a ratio of sums over prompts, as tau is
        "ratio_ci95": [round(v, 3) for v in bootstrap_interval([p[:2] for p in per_prompt])],
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }
    check = {"prompts": len(prompts), "tokens": checked_tokens, "mismatches": mismatches,
             "first_divergence": first_divergence}
    if target.dtype != torch.float32:
        check["near_ties"] = near_ties
    return speed, check


@torch.inference_mode()
def near_tie(target: Target, prompt_ids: list[int], expected: list[int], got: list[int],
             position: int) -> dict | None:
    """Whether the greedy outputs' first difference, at `position`, is a rounding tie (module docstring): the
    target's logits after the prompt and expected[:position], recomputed; both tokens' logits within NEAR_TIE_ULPS
    of the dtype's resolution of the top logit. The gap and that resolution, or None (a mismatch)."""
    if position >= min(len(expected), len(got)):
        return None  # one output is longer: a stop, not a rounding
    logits, _ = target.forward(torch.tensor([prompt_ids + expected[:position]], device=target.device),
                               logits_to_keep=1)
    row = logits[0, -1].float()
    top = row.max()
    resolution = torch.finfo(target.dtype).eps * 2.0 ** torch.floor(torch.log2(top.abs().clamp_min(1e-30)))
    pair = row[[expected[position], got[position]]]
    if float(top - pair.min()) > NEAR_TIE_ULPS * float(resolution):
        return None
    return {"expected": expected[position], "got": got[position],
            "logit_gap": round(float((pair[0] - pair[1]).abs()), 6), "resolution": float(resolution)}


def serving_advice(speed: dict, block_size: int) -> dict:
    """Whether to enable the drafter on hardware like the validation machine, from the measured speedup: a
    drafter whose interval lies below 1x would slow serving down there, and the report says so plainly."""
    ratio, (low, high) = speed["ratio"], speed["ratio_ci95"]
    if high < 1.0:
        return {"enable": False, "summary": f"do not enable this drafter on hardware like the validation machine: "
                f"it decoded at {ratio}x the target alone (95 % interval {low}-{high}x) at block size {block_size}; "
                "it pays off where a verify pass costs little more than a decode step (GPUs, larger targets)"}
    if low > 1.0:
        return {"enable": True, "summary": f"enable at block size {block_size}: {ratio}x the target alone "
                f"(95 % interval {low}-{high}x) on the validation machine"}
    return {"enable": None, "summary": f"no clear gain on the validation machine: {ratio}x the target alone "
            f"(95 % interval {low}-{high}x) at block size {block_size}; measure on your serving hardware"}


@torch.inference_mode()
def measure_step_costs(target: Target, drafter: Drafter, prompt: list[int], repeats: int = 5,
                       on_each: Callable[[], None] | None = None) -> dict:
    """Seconds to verify b tokens after the prompt (b = 1 is a plain decode step; b > 1 also captures the
    taps, as a verify does) and to draft a block of b (b - 1 drafts: the drafter, its LM head over the draft
    vocabulary if it has one, the selector walk), each the median of `repeats` after a warm-up. `on_each`
    follows every block size."""
    device, block = target.device, drafter.config.block_size
    taps = list(drafter.config.target_layer_ids)
    cache = target.new_cache()
    _, context = target.forward(torch.tensor([prompt], device=device), cache=cache, tap_layer_ids=taps)
    decoder = SpeculativeDecoder(target, drafter)
    greedy = SamplingParams(temperature=0.0)

    def median_seconds(run) -> float:
        run()
        times = []
        for _ in range(repeats):
            synchronize(device)  # GPU kernels run asynchronously: time this run's work, whole
            started = time.perf_counter()
            run()
            synchronize(device)
            times.append(time.perf_counter() - started)
        return statistics.median(times)

    mark = target.mark(cache)

    def verify(b: int) -> None:
        target.forward(torch.full((1, b), 5, device=device), torch.arange(len(prompt), len(prompt) + b,
                       device=device)[None], cache=cache, tap_layer_ids=taps if b > 1 else None)
        target.rewind(cache, mark, [])

    def draft(b: int) -> None:
        decoder._draft(5, len(prompt), b, context, 0, DrafterCache(drafter.config.num_layers), greedy, None)

    costs = {"verify": {}, "draft": {}, "repeats": repeats,
             "draft_vocab_size": None if decoder.draft_vocab is None else len(decoder.draft_vocab)}
    with torch.inference_mode():
        for b in range(1, block + 1):
            costs["verify"][b] = median_seconds(lambda b=b: verify(b))
            if b > 1:
                costs["draft"][b] = median_seconds(lambda b=b: draft(b))
            if on_each:
                on_each()
    return costs


def require_passed(report: ValidationReport | Mapping) -> None:
    """Raise unless the report proves the drafter lossless (`report`: the model, or report.json's object)."""
    report = ValidationReport.read(report)
    if report.passed:
        return
    greedy, sampling = report.greedy, report.sampling
    if greedy.mismatches:
        divergence = greedy.first_divergence.model_dump(mode="json") if greedy.first_divergence else None
        raise ValidationFailed(f"speculative output differs from the target's on {greedy.mismatches} of "
                               f"{greedy.prompts} prompts (first at {divergence})")
    if sampling.status == "inconclusive":
        raise SamplingInconclusive(f"the speculative-sampling test could not test anything: {sampling.reason}")
    p_value = "unknown" if sampling.p_value is None else f"{sampling.p_value:.2e}"
    raise ValidationFailed(f"speculative sampling failed the distribution test (p = {p_value})")
