"""The self-test at prepare: a few tokens of speculative decoding with arbitrary drafts against the target alone,
on the customer's own checkpoint, before any compute is spent on it.

The contract (trainer/targets/contract.py) says how each layer's cache is put back after a verify; this checks that
it is true of this checkpoint, whatever its architecture, listed or not. Two checks, both exact:

1. Rollback: the prompt through the target into two caches; one then takes a verify of random drafts and is
   rewound to the prompt (nothing kept). Every layer's cache must then hold what the other holds: keys and values,
   convolution and recurrent states, bit for bit (both saw the same forwards at the same shapes). The first layer
   that differs is named with its kind and cache class: a stateful layer that was merely cropped fails here.
2. Greedy: the target's own greedy continuation of the prompt, one token per forward, against speculative decoding
   with seeded drafts (some cycles offer a run of the right tokens then a wrong one, some only wrong ones, some
   all right ones: full, partial and no acceptance all happen, each followed by the rollback). The outputs must be
   equal token for token. In a dtype other than float32 every forward of the reference is as wide as a verify
   (validation's greedy gate, trainer/validation/report.py: rounding depends on shapes), and a first difference
   that is a rounding tie by validation's rule (both tokens' logits within 2 units of the dtype's resolution) is
   recorded as `near_tie`, not failed; in float32 any difference fails.

A failure stops the job at prepare naming the layer, its kind and what differed (trainer/errors.py
`TargetSelfTestFailed`, code `target_self_test_failed`); the result is recorded in prepare.json and in
report.json's `target` (schemas/work_files.py `TargetSelfTest`).
"""

from __future__ import annotations

import time

import torch

from schemas.work_files import TargetSelfTest
from trainer.errors import TargetSelfTestFailed
from trainer.targets.loading import Target

PROMPT_TOKENS = 6
NEW_TOKENS = 12
BLOCK_SIZE = 4
DRIFT_LIMIT = {False: 0.1, True: 0.1}
"""The most a verify's logits may stray from the one-token decode's, over the logits' spread (float32; other
dtypes). It catches a cached multi-token forward that computes something else (transformers' Mamba mixer ignores
the state there: 0.65 to 0.97 on a random Mamba with weights of scale 0.3), not rounding: a correct cache stays
within a few 1e-5 in float32, and a Mamba-2 chunked scan against its recurrent step within 0.02 (Nemotron-H, same
weights, whose sampling test passes)."""


def _state_tensors(layer) -> dict[str, torch.Tensor]:
    """What one cache layer holds, by name: keys and values, convolution and recurrent states."""
    found: dict[str, torch.Tensor] = {}
    for name in ("keys", "values"):
        if isinstance(getattr(layer, name, None), torch.Tensor):
            found[name] = getattr(layer, name)
    for name in ("conv_states", "recurrent_states"):
        for index, value in (getattr(layer, name, None) or {}).items():
            if isinstance(value, torch.Tensor):
                found[f"{name}[{index}]"] = value
    return found


def _trailing(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The two tensors' common tail along the one dimension where their lengths differ (a window or a convolution
    state may legitimately keep more of the past in one cache than in the other, never a different recent past)."""
    if a.shape == b.shape or a.dim() != b.dim():
        return a, b
    differ = [d for d in range(a.dim()) if a.shape[d] != b.shape[d]]
    if len(differ) != 1:
        return a, b
    keep = min(a.shape[differ[0]], b.shape[differ[0]])
    return a.narrow(differ[0], a.shape[differ[0]] - keep, keep), b.narrow(differ[0], b.shape[differ[0]] - keep, keep)


def first_differing_layer(expected, got) -> tuple[int, str] | None:
    """(index, what differs) of the first cache layer whose contents differ, else None."""
    for index, (want, have) in enumerate(zip(expected.layers, got.layers, strict=True)):
        want_states, have_states = _state_tensors(want), _state_tensors(have)
        if set(want_states) != set(have_states):
            return index, f"holds {sorted(have_states)} where the target alone holds {sorted(want_states)}"
        for name, value in want_states.items():
            a, b = _trailing(value, have_states[name])
            if a.shape != b.shape:
                return index, f"its {name} has shape {tuple(b.shape)} against {tuple(a.shape)}"
            if not torch.equal(a, b):
                gap = float((a.float() - b.float()).abs().max())
                return index, f"its {name} differs (largest difference {gap:.3g})"
    return None


@torch.inference_mode()
def _rollback_check(target: Target, prompt: list[int], drafts: list[int]) -> tuple[int, str] | None:
    device = target.device
    ids, positions = torch.tensor([prompt], device=device), torch.arange(len(prompt), device=device)[None]
    alone, tested = target.new_cache(), target.new_cache()
    target.forward(ids, positions, cache=alone, logits_to_keep=1)
    target.forward(ids, positions, cache=tested, logits_to_keep=1)
    mark = target.mark(tested)
    target.forward(torch.tensor([drafts], device=device),
                   torch.arange(len(prompt), len(prompt) + len(drafts), device=device)[None], cache=tested)
    target.rewind(tested, mark, [])
    return first_differing_layer(alone, tested)


@torch.inference_mode()
def _greedy_alone(target: Target, prompt: list[int], new_tokens: int, width: int
                  ) -> tuple[list[int], list[torch.Tensor]]:
    """The target's greedy continuation, one token committed per forward, every forward `width` wide (the token,
    then copies of it whose logits are dropped and whose cache entries are taken back), and the logits each token
    was chosen from."""
    cache, device = target.new_cache(), target.device
    logits, _ = target.forward(torch.tensor([prompt], device=device), cache=cache, logits_to_keep=1)
    rows = [logits[0, -1].float().cpu()]
    tokens = [int(rows[-1].argmax())]
    while len(tokens) < new_tokens:
        start = len(prompt) + len(tokens) - 1
        mark = target.mark(cache)
        logits, _ = target.forward(torch.tensor([[tokens[-1]] * width], device=device),
                                   torch.arange(start, start + width, device=device)[None], cache=cache)
        target.rewind(cache, mark, tokens[-1:])
        rows.append(logits[0, 0].float().cpu())
        tokens.append(int(rows[-1].argmax()))
    return tokens, rows


def _drift(verify_rows: torch.Tensor, reference_rows: list[torch.Tensor], first: int) -> float:
    """How far a verify's logits stray from the target's own one-token logits for the same prefixes: the largest
    difference over each reference row's spread (max - min logit). A few 1e-4 for a correct cache in float32."""
    worst = 0.0
    for offset, row in enumerate(verify_rows):
        reference = reference_rows[first + offset]
        spread = float(reference.max() - reference.min()) or 1.0
        worst = max(worst, float((row.float().cpu() - reference).abs().max()) / spread)
    return worst


@torch.inference_mode()
def _speculative(target: Target, prompt: list[int], reference: list[int], rows: list[torch.Tensor],
                 generator: torch.Generator) -> tuple[list[int], int, int, float]:
    """Greedy speculative decoding with seeded drafts: each cycle offers the next `right` tokens of the reference
    (0 to the whole block, drawn) then wrong ones. Returns the tokens, the cycles, the drafts rejected and the
    verifies' worst drift from the reference's logits (`_drift`) over the block positions whose prefix is the
    reference's: a verify reads several tokens over the cache in one forward, which argmax alone may not show."""
    cache, device, vocab = target.new_cache(), target.device, target.vocab_size
    logits, _ = target.forward(torch.tensor([prompt], device=device), cache=cache, logits_to_keep=1)
    tokens, cycles, rejected, drift = [int(logits[0, -1].argmax())], 0, 0, 0.0
    while len(tokens) < len(reference):
        start = len(prompt) + len(tokens) - 1
        right = int(torch.randint(0, BLOCK_SIZE, (1,), generator=generator))
        drafts = list(reference[len(tokens):len(tokens) + right])
        while len(drafts) < BLOCK_SIZE - 1:
            drafts.append(int(torch.randint(0, vocab, (1,), generator=generator)))
        block = [tokens[-1], *drafts]
        mark = target.mark(cache)
        logits, _ = target.forward(torch.tensor([block], device=device),
                                   torch.arange(start, start + len(block), device=device)[None], cache=cache)
        chosen = logits[0].argmax(-1).tolist()
        if tokens == reference[:len(tokens)]:  # block positions 0..right read the reference's own prefixes
            known = min(right, len(reference) - len(tokens) - 1)  # drafts past the reference's end are random
            drift = max(drift, _drift(logits[0, :known + 1], rows, len(tokens)))
        accepted = 0
        while accepted < len(drafts) and drafts[accepted] == chosen[accepted]:
            accepted += 1
        new = (drafts[:accepted] + [chosen[accepted]])[:len(reference) - len(tokens)]
        target.rewind(cache, mark, block[:len(new)])
        tokens += new
        cycles, rejected = cycles + 1, rejected + len(drafts) - accepted
    return tokens, cycles, rejected, drift


def run_self_test(target: Target, *, seed: int = 0, new_tokens: int = NEW_TOKENS) -> TargetSelfTest:
    """The self-test's result (module docstring); never raises for a failed check (`require_passed` does)."""
    started = time.perf_counter()
    generator = torch.Generator().manual_seed(seed)
    vocab = target.vocab_size
    prompt = torch.randint(0, vocab, (PROMPT_TOKENS,), generator=generator).tolist()
    drafts = torch.randint(0, vocab, (BLOCK_SIZE,), generator=generator).tolist()
    width = 1 if target.dtype == torch.float32 else BLOCK_SIZE
    result = TargetSelfTest(
        passed=False, tokens=new_tokens, block_size=BLOCK_SIZE, seed=seed, dtype=str(target.dtype).removeprefix(
            "torch."), reference="one token per forward" if width == 1 else f"every forward {width} tokens wide")
    try:  # reading the contract runs the model's first forward with a cache: its failure is the self-test's
        contract = target.contract
    except Exception as exc:
        return _done(result, started, reason=f"the contract could not be read from the model (a forward with its "
                     f"cache raised {type(exc).__name__}: {str(exc)[:300]})")
    result.layer_kinds, result.rollback_by_kind = contract.layer_kinds(), contract.rollback_by_kind()
    result.rollback = target.rollback.value
    try:
        differing = _rollback_check(target, prompt, drafts)
        if differing is not None:
            index, what = differing
            layer = contract.layers[index]
            rollback = "crop" if target.rollback.value == "crop" and layer.rollback == "replay" else layer.rollback
            return _done(result, started, layer=index, layer_kind=layer.kind, reason=(
                f"after a verify was taken back ({rollback}), layer {index} ({layer.kind}, cache "
                f"{layer.cache_layer}) {what}: its cache does not go back to the state before the verify"))
        expected, rows = _greedy_alone(target, prompt, new_tokens, width)
        got, cycles, rejected, drift = _speculative(target, prompt, expected, rows, generator)
    except Exception as exc:  # any failure of the target's forward or cache under speculative decoding
        return _done(result, started, reason=f"speculative decoding raised {type(exc).__name__}: {str(exc)[:300]}")
    result.cycles, result.drafts_rejected, result.logit_drift = cycles, rejected, round(drift, 6)
    limit = DRIFT_LIMIT[width > 1]
    if drift > limit:
        kinds = ", ".join(sorted({f"{layer.kind} ({layer.rollback})" for layer in contract.layers}))
        return _done(result, started, reason=(
            f"a verify's logits differ from the target's own one-token decode of the same tokens by {drift:.3g} of "
            f"their spread (limit {limit}): a forward of several tokens over the cache does not compute what the "
            f"model computes one token at a time; layers: {kinds}"))
    if got != expected:
        at = next(i for i, (a, b) in enumerate(zip(expected, got, strict=True)) if a != b)
        if width > 1 and (tie := _near_tie(target, prompt, expected, got, at)) is not None:
            result.passed, result.near_tie = True, tie  # a rounding tie of a narrow dtype, said so, not hidden
            return _done(result, started)
        kinds = ", ".join(sorted({f"{layer.kind} ({layer.rollback})" for layer in contract.layers}))
        return _done(result, started, reason=(
            f"greedy speculative output differs from the target alone at token {at} ({got[at]} against "
            f"{expected[at]}) though every cache layer went back exactly; layers: {kinds}"))
    result.passed = True
    return _done(result, started)


def _near_tie(target: Target, prompt: list[int], expected: list[int], got: list[int], at: int) -> dict | None:
    """Validation's rule for bfloat16 (trainer/validation/report.py `near_tie`): where the outputs first differ,
    both tokens' logits within a few units of the dtype's resolution of the top logit are a rounding tie between
    two forwards of different shapes, not a rollback error. Never applies in float32."""
    from trainer.validation.report import near_tie

    return near_tie(target, prompt, expected, got, at)


def _done(result: TargetSelfTest, started: float, *, reason: str | None = None, layer: int | None = None,
          layer_kind: str | None = None) -> TargetSelfTest:
    result.failure, result.layer, result.layer_kind = reason, layer, layer_kind
    result.seconds = round(time.perf_counter() - started, 3)
    return result


def require_passed(result: TargetSelfTest, model_type: str | None) -> None:
    """Stops the job at prepare with what failed, for an architecture listed or not."""
    if not result.passed:
        raise TargetSelfTestFailed(f"target ({model_type}) failed the speculative-decoding self-test: "
                                   f"{result.failure}. Its drafter could not be verified losslessly; nothing was "
                                   "trained")
