"""The plain-torch references in kernels/ against the formula written out element by element, and
against the reference `dflash` package (which our exports must match)."""

from __future__ import annotations

import pytest
import torch

from kernels import edge_scores, grouped_dynamic_conv, selector_walk


def conv_by_formula(x, delta, base, group_size):
    rows, length, hidden = x.shape
    out = torch.zeros_like(x)
    for r in range(rows):
        for t in range(length):
            for c in range(hidden):
                for o in range(base.shape[0]):
                    if t - o >= 0:
                        out[r, t, c] += (base[o, c] + delta[r, t, o, c // group_size]) * x[r, t - o, c]
    return out


@pytest.mark.parametrize("taps", [1, 2, 3])
def test_grouped_dynamic_conv_matches_formula(taps):
    torch.manual_seed(taps)
    x, delta, base = torch.randn(2, 5, 8), torch.randn(2, 5, taps, 2), torch.randn(taps, 8)
    torch.testing.assert_close(grouped_dynamic_conv(x, delta, base, 4), conv_by_formula(x, delta, base, 4))


def test_grouped_dynamic_conv_matches_reference_package():
    from dflash.model import _grouped_dynamic_convolve

    torch.manual_seed(0)
    x, delta, base = torch.randn(3, 7, 32), torch.randn(3, 7, 2, 2), torch.randn(2, 32)
    torch.testing.assert_close(grouped_dynamic_conv(x, delta, base, 16), _grouped_dynamic_convolve(x, delta, base, 16))


def test_identity_kernel_is_identity():
    x = torch.randn(2, 6, 32)
    base = torch.zeros(2, 32)
    base[0] = 1
    torch.testing.assert_close(grouped_dynamic_conv(x, torch.zeros(2, 6, 2, 2), base, 16), x)


def test_rows_do_not_leak_into_each_other():
    """Taps never cross a block boundary: each row is convolved as if alone."""
    torch.manual_seed(1)
    x, delta, base = torch.randn(4, 5, 16), torch.randn(4, 5, 2, 1), torch.randn(2, 16)
    together = grouped_dynamic_conv(x, delta, base, 16)
    for row in range(4):
        torch.testing.assert_close(together[row], grouped_dynamic_conv(x[row:row + 1], delta[row:row + 1], base, 16)[0])


def test_edge_scores_by_formula():
    torch.manual_seed(2)
    vocab, rank, k = 20, 4, 5
    a_book, b_book = torch.randn(vocab, rank), torch.randn(vocab, rank)
    unary, candidates = torch.randn(3, k), torch.randint(0, vocab, (3, k))
    hidden, prev = torch.randn(3, rank), torch.randint(0, vocab, (3,))
    scores = edge_scores(unary, candidates, hidden, prev, a_book, b_book)
    for row in range(3):
        for j in range(k):
            expected = unary[row, j] + (a_book[prev[row]] * hidden[row] * b_book[candidates[row, j]]).sum()
            torch.testing.assert_close(scores[row, j], expected)


def test_selector_walk_matches_reference_package():
    from types import SimpleNamespace

    from dflash.model import CandidateSelector

    torch.manual_seed(3)
    vocab, hidden_size, rank, k = 50, 12, 6, 7
    config = SimpleNamespace(vocab_size=vocab, hidden_size=hidden_size, dflash_config={"selector_rank": rank,
                                                                                        "selector_top_k": k})
    reference = CandidateSelector(config)
    hidden, logits, anchors = torch.randn(2, 5, hidden_size), torch.randn(2, 5, vocab), torch.tensor([3, 8])
    with torch.no_grad():
        theirs = reference.select(hidden, logits, anchors, 0.0)
        ours = selector_walk(logits, reference.hidden_projection(hidden), anchors,
                             reference.predecessor_codebook.weight, reference.successor_codebook.weight, k, 0.0)
    assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1])
    assert ours[2] is None
    # Sampling: the proposal rows are distributions over the candidates and the path follows them.
    path, candidates, q = selector_walk(logits, reference.hidden_projection(hidden).detach(), anchors,
                                        reference.predecessor_codebook.weight.detach(),
                                        reference.successor_codebook.weight.detach(), k, 1.0,
                                        torch.Generator().manual_seed(0))
    torch.testing.assert_close(q.sum(-1), torch.ones(2, 5))
    assert bool((candidates == path[..., None]).any(-1).all())
