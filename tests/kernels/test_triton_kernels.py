"""The Triton kernels in kernels/triton_*.py against the plain-torch references, on CPU tensors under Triton's
interpreter (TRITON_INTERPRET=1), forward and backward.

Tolerances: float32 inputs 1e-5 relative and absolute (the kernels sum in float32, in another order);
bfloat16 inputs 2e-2 relative and absolute, against the reference run in float32 on the same (bf16-valued)
inputs (the kernels compute in float32 and round once at the end; the bf16 reference rounds every step).

Triton's interpreter must be on before `triton.language` is first imported (its own @triton.jit helpers, tl.zeros
and the like, are made interpreted or compiled at that moment), and the rest of the suite may have imported it
already, compiled. So in an ordinary run this file collects one test, `test_in_an_interpreter_process`, which
reruns this file in a fresh Python with TRITON_INTERPRET=1 (the env var never touches the parent process); in
that process the kernel cases run. To run the cases directly: `TRITON_INTERPRET=1 pytest <this file>`.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernels import dynamic_conv, linear_cross_entropy, selector
from kernels.dynamic_conv import grouped_dynamic_conv
from kernels.selector import edge_scores, selector_walk

F32 = {"rtol": 1e-5, "atol": 1e-5}
BF16 = {"rtol": 2e-2, "atol": 2e-2}
HAVE_TRITON = importlib.util.find_spec("triton") is not None


def interpreter_on() -> bool:
    """Whether this process runs Triton programs in the interpreter (env set before triton.language loaded)."""
    if not HAVE_TRITON or os.environ.get("TRITON_INTERPRET") != "1":
        return False
    import triton.language as tl

    return type(tl.zeros).__name__ == "InterpretedFunction"


INTERPRETED = interpreter_on()
pytestmark = pytest.mark.skipif(not HAVE_TRITON, reason="triton is not installed")
in_interpreter = pytest.mark.skipif(not INTERPRETED, reason="runs in the child of test_in_an_interpreter_process")


@pytest.mark.skipif(INTERPRETED, reason="already in the interpreter process")
def test_in_an_interpreter_process():
    """Every kernel case below, in a fresh process with Triton's interpreter on (CPU tensors)."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__,
                             "-k", "not test_in_an_interpreter_process"], env=env, capture_output=True, text=True,
                            timeout=300, cwd=Path(__file__).resolve().parents[2])
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-4000:]
    summary = result.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "skipped" not in summary, summary  # every case ran, none quietly skipped
    print(summary)


@pytest.fixture(scope="module")
def interpreted():
    """The three kernel modules (interpreted: this process started with TRITON_INTERPRET=1)."""
    import kernels.triton_dynamic_conv
    import kernels.triton_linear_cross_entropy
    import kernels.triton_selector

    return {"triton_dynamic_conv": kernels.triton_dynamic_conv, "triton_selector": kernels.triton_selector,
            "triton_linear_cross_entropy": kernels.triton_linear_cross_entropy}


def grads(output, inputs, upstream):
    return torch.autograd.grad(output, [t for t in inputs if t.requires_grad], upstream)


def leaves(*tensors, dtype):
    return [t.to(dtype).requires_grad_(t.is_floating_point()) for t in tensors]


def assert_matches(triton_out, reference_out, dtype):
    tolerance = F32 if dtype == torch.float32 else BF16
    for ours, theirs in zip(triton_out, reference_out, strict=True):
        scale = max(1.0, float(theirs.detach().abs().max()))  # bf16: 2e-2 of the largest value, not of values near 0
        atol = tolerance["atol"] * (scale if dtype != torch.float32 else 1.0)
        torch.testing.assert_close(ours.float(), theirs.float(), rtol=tolerance["rtol"], atol=atol)


# ---------------------------------------------------------------- dynamic convolution


@in_interpreter
@pytest.mark.parametrize(("lead", "length", "hidden", "group", "taps", "dtype"), [
    ((3,), 5, 32, 16, 2, torch.float32),     # DFlash 2's shape: two taps, groups of 16
    ((2,), 1, 8, 4, 2, torch.float32),       # block length 1
    ((2,), 3, 24, 8, 5, torch.float32),      # taps > length
    ((2, 2), 1, 8, 4, 3, torch.float32),     # taps > length + 1 (the reference used to misshape this), 2 lead dims
    ((2,), 20, 80, 16, 2, torch.bfloat16),   # two position blocks (16 + 4), H not a multiple of the channel block
    ((3,), 8, 64, 16, 2, torch.bfloat16),
])
def test_dynamic_conv(interpreted, lead, length, hidden, group, taps, dtype):
    torch.manual_seed(length * 31 + taps)
    raw = (torch.randn(*lead, length, hidden), torch.randn(*lead, length, taps, hidden // group),
           torch.randn(taps, hidden))
    ours_in = leaves(*raw, dtype=dtype)
    ref_in = leaves(*(t.to(dtype) for t in raw), dtype=torch.float32)  # same values, computed in float32
    out = interpreted["triton_dynamic_conv"].triton_grouped_dynamic_conv(*ours_in, group)
    ref = grouped_dynamic_conv(*ref_in, group)
    assert out.dtype == dtype and out.shape == ref.shape
    upstream = torch.randn_like(ref)
    assert_matches([out], [ref], dtype)
    assert_matches(grads(out, ours_in, upstream.to(dtype)), grads(ref, ref_in, upstream), dtype)


@in_interpreter
def test_dynamic_conv_frozen_base_and_identity(interpreted):
    """Only the inputs that need a gradient get one; the identity kernel is the identity."""
    x = torch.randn(2, 6, 32, requires_grad=True)
    base = torch.zeros(2, 32)
    base[0] = 1
    out = interpreted["triton_dynamic_conv"].triton_grouped_dynamic_conv(x, torch.zeros(2, 6, 2, 2), base, 16)
    torch.testing.assert_close(out, x)
    (dx,) = torch.autograd.grad(out, x, torch.ones_like(out))
    torch.testing.assert_close(dx, torch.ones_like(x))


# ---------------------------------------------------------------- selector edge scores


@in_interpreter
@pytest.mark.parametrize(("lead", "top_k", "vocab", "rank", "dtype"), [
    ((3, 4), 5, 20, 6, torch.float32),       # small vocabulary: the same token at many positions (scatter-adds)
    ((7,), 1, 10, 200, torch.float32),       # top-K = 1; rank 200 = two rank steps, the second partial
    ((2, 3), 16, 40, 256, torch.bfloat16),   # DFlash 2's K and r
])
def test_edge_scores(interpreted, lead, top_k, vocab, rank, dtype):
    torch.manual_seed(top_k + rank)
    unary, hidden = torch.randn(*lead, top_k), torch.randn(*lead, rank)
    a_book, b_book = torch.randn(vocab, rank), torch.randn(vocab, rank)
    candidates = torch.stack([torch.randperm(vocab)[:top_k] for _ in range(int(torch.tensor(lead).prod()))])
    candidates = candidates.view(*lead, top_k)
    predecessors = torch.randint(0, vocab, lead)
    ours_in = leaves(unary, hidden, a_book, b_book, dtype=dtype)
    ref_in = leaves(*(t.to(dtype) for t in (unary, hidden, a_book, b_book)), dtype=torch.float32)

    def call(function, u, h, a, b):
        return function(u, candidates, h, predecessors, a, b)

    out = call(interpreted["triton_selector"].triton_edge_scores, *ours_in)
    ref = call(edge_scores, *ref_in)
    assert out.dtype == dtype and out.shape == ref.shape
    upstream = torch.randn_like(ref)
    assert_matches([out], [ref], dtype)
    assert_matches(grads(out, ours_in, upstream.to(dtype)), grads(ref, ref_in, upstream), dtype)


@in_interpreter
def test_edge_scores_frozen_codebooks(interpreted):
    """Gradient to the projected hidden state only (frozen codebooks, as the walk at inference sees them)."""
    torch.manual_seed(5)
    unary, candidates = torch.randn(6, 4), torch.randint(0, 30, (6, 4))
    hidden, predecessors = torch.randn(6, 8, requires_grad=True), torch.randint(0, 30, (6,))
    a_book, b_book = torch.randn(30, 8), torch.randn(30, 8)
    out = interpreted["triton_selector"].triton_edge_scores(unary, candidates, hidden, predecessors, a_book, b_book)
    ref = edge_scores(unary, candidates, hidden, predecessors, a_book, b_book)
    upstream = torch.randn_like(ref)
    assert_matches([out, *grads(out, [hidden], upstream)], [ref, *grads(ref, [hidden], upstream)], torch.float32)


# ---------------------------------------------------------------- linear cross-entropy


def plain_row_cross_entropy(hidden, head, labels, top_k, soft_ids=None, soft_probs=None, soft_weight=0.0):
    """Per-row losses, argmax and top-k the plain way (float32 logits), as the reference defines them."""
    logits = (hidden.float() @ head.float().T)
    target = linear_cross_entropy._target_distribution(*logits.shape, labels, soft_ids, soft_probs, soft_weight,
                                                       logits.device)
    losses = -(target * torch.log_softmax(logits, dim=-1)).sum(-1)
    return losses, logits.argmax(-1), logits.topk(top_k, dim=-1).indices if top_k else None


@in_interpreter
@pytest.mark.parametrize(("rows", "width", "vocab", "top_k", "soft_weight", "block_v", "splits", "dtype"), [
    (20, 24, 301, 5, 0.0, 64, None, torch.float32),   # vocabulary not a multiple of the tile: a partial last tile
    (9, 40, 100, 16, 0.6, 16, 3, torch.float32),      # top-K = tile width, several tiles per split, soft targets
    (1, 16, 64, 1, 0.0, 16, 2, torch.float32),        # one row, top-K = 1, vocabulary an exact number of tiles
    (70, 16, 90, 3, 0.0, 32, 2, torch.float32),       # two row blocks, top-K not a power of two
    (20, 24, 301, 4, 0.5, 64, None, torch.bfloat16),
])
def test_row_cross_entropy(interpreted, rows, width, vocab, top_k, soft_weight, block_v, splits, dtype):
    torch.manual_seed(rows + vocab)
    hidden, head = torch.randn(rows, width), torch.randn(vocab, width)
    labels = torch.randint(0, vocab, (rows,))
    labels[: min(rows, 4)] = torch.tensor([0, block_v - 1, block_v, vocab - 1])[: min(rows, 4)]  # tile edges
    soft = {}
    if soft_weight:
        soft_ids = torch.randint(0, vocab, (rows, 4))
        soft_ids[:, 0] = labels  # a teacher's ids may repeat the gold label
        soft = {"soft_ids": soft_ids, "soft_probs": torch.softmax(torch.randn(rows, 4), -1), "soft_weight": soft_weight}
    ours_in = leaves(hidden, head, dtype=dtype)  # a trainable head too: the Triton function supports one
    ref_in = leaves(hidden.to(dtype), head.to(dtype), dtype=torch.float32)
    losses, predicted, top = interpreted["triton_linear_cross_entropy"].triton_row_cross_entropy(
        *ours_in, labels, top_k, block_v=block_v, splits=splits, **soft)
    ref_losses, ref_predicted, ref_top = plain_row_cross_entropy(*ref_in, labels, top_k, **soft)
    assert losses.dtype == torch.float32 and predicted.dtype == torch.long
    assert torch.equal(predicted, ref_predicted)
    assert torch.equal(top.sort(-1).values, ref_top.sort(-1).values)
    upstream = torch.rand(rows)
    upstream[::3] = 0  # ignored rows: zero weight, so no gradient from them
    assert_matches([losses], [ref_losses], dtype)
    ours_grads = grads(losses, ours_in, upstream)
    assert_matches(ours_grads, grads(ref_losses, ref_in, upstream), dtype)
    assert ours_grads[0].dtype == dtype and ours_grads[1].dtype == dtype
    assert not ours_grads[0][::3].any()


@in_interpreter
def test_row_cross_entropy_frozen_head_matches_the_fused_reference(interpreted):
    """With the head frozen (the trainer's case) the Triton function gives what row_cross_entropy gives on CPU."""
    torch.manual_seed(7)
    head, start, labels = torch.randn(150, 32), torch.randn(12, 32), torch.randint(0, 150, (12,))
    results = []
    for function in (linear_cross_entropy.row_cross_entropy,
                     interpreted["triton_linear_cross_entropy"].triton_row_cross_entropy):
        hidden = start.clone().requires_grad_(True)
        losses, predicted, top = function(hidden, head, labels, 16)
        results.append((losses, predicted, top, *torch.autograd.grad(2.5 * losses.sum(), hidden)))
    (loss_a, pred_a, top_a, grad_a), (loss_b, pred_b, top_b, grad_b) = results
    assert_matches([loss_b, grad_b], [loss_a, grad_a], torch.float32)
    assert torch.equal(pred_a, pred_b) and torch.equal(top_a.sort(-1).values, top_b.sort(-1).values)


# ---------------------------------------------------------------- dispatch


def test_cpu_tensors_take_the_torch_path():
    """On CPU the public ops never reach Triton, so results stay the references' (the main job unchanged)."""
    from kernels._triton import use_triton

    assert not use_triton(torch.randn(2), torch.randn(2))
    assert not use_triton()


def graph(tensor) -> set[str]:
    """The names of the autograd nodes behind a tensor."""
    names, todo = set(), [tensor.grad_fn]
    while todo:
        node = todo.pop()
        if node is not None and node.name() not in names:
            names.add(node.name())
            todo += [parent for parent, _ in node.next_functions]
    return names


@in_interpreter
def test_public_ops_dispatch_to_the_kernels(interpreted, monkeypatch):
    """With the dispatch forced on (as for CUDA tensors), the public functions route to the Triton kernels and give
    the torch path's results; the selector walk itself stays torch and scores its steps through the kernel."""
    def both(module, call):
        results = []
        for on in (False, True):
            monkeypatch.setattr(module, "use_triton", lambda *tensors, on=on: on)
            results.append(call())
        return results

    torch.manual_seed(11)
    x, delta, base = torch.randn(2, 4, 16, requires_grad=True), torch.randn(2, 4, 2, 1), torch.randn(2, 16)
    plain, fast = both(dynamic_conv, lambda: grouped_dynamic_conv(x, delta, base, 16))
    assert "TritonGroupedDynamicConvBackward" in graph(fast) and "TritonGroupedDynamicConvBackward" not in graph(plain)
    assert_matches([fast], [plain], torch.float32)

    logits, hidden, anchors = torch.randn(2, 3, 40), torch.randn(2, 3, 8), torch.tensor([1, 2])
    a_book, b_book = torch.randn(40, 8), torch.randn(40, 8)
    plain, fast = both(selector, lambda: selector_walk(logits, hidden, anchors, a_book, b_book, 4, 0.0))
    assert torch.equal(fast[0], plain[0]) and torch.equal(fast[1], plain[1])

    hidden, head, labels = torch.randn(5, 8, requires_grad=True), torch.randn(30, 8), torch.randint(0, 30, (5,))
    plain, fast = both(linear_cross_entropy, lambda: linear_cross_entropy.row_cross_entropy(hidden, head, labels, 4))
    assert "TritonRowCrossEntropyBackward" in graph(fast[0])
    assert_matches([fast[0]], [plain[0]], torch.float32)
    assert torch.equal(fast[1], plain[1])
