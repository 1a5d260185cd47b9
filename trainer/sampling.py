"""Token distributions after temperature / top-k / top-p, and speculative rejection sampling.

Rejection sampling (Leviathan et al., Chen et al.): draft i, proposed with probability q_i(d_i), is
accepted with probability min(1, p_i(d_i) / q_i(d_i)); at the first rejection the token is drawn from
the residual norm(max(p_i - q_i, 0)); if every draft is accepted a bonus token is drawn from p_L. The
emitted tokens are then distributed exactly as the target's p, whatever q is.
"""

from __future__ import annotations

import torch

from schemas.sampling import SamplingParams


def filtered_probs(logits: torch.Tensor, temperature: float, top_p: float = 1.0, top_k: int = 0) -> torch.Tensor:
    """softmax(logits / T) restricted to the top-k tokens, then to the top-p nucleus, renormalised."""
    scores = logits.float() / temperature
    vocab = scores.shape[-1]
    indices = None
    if 0 < top_k < vocab:
        scores, indices = torch.topk(scores, top_k, dim=-1)
    probs = torch.softmax(scores, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # Keep a token while the mass before it is below top_p: the smallest set reaching top_p.
        keep = sorted_probs.cumsum(dim=-1) - sorted_probs < top_p
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs * keep)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    if indices is not None:
        probs = torch.zeros_like(logits, dtype=probs.dtype).scatter(-1, indices, probs)
    return probs


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    return filtered_probs(logits, params.temperature, params.top_p, params.top_k)


def seeded_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """The generator every sampler draws with: seeded, and on the device its draws happen on (the probabilities'
    device; torch refuses a generator of another device). On the CPU it is exactly `torch.Generator().manual_seed
    (seed)`, so CPU results are what they always were; a GPU's stream differs from the CPU's for the same seed."""
    return torch.Generator(device=torch.device(device)).manual_seed(seed)


def check_generator(generator: torch.Generator | None, device: torch.device) -> None:
    """Refuse a generator made for another device than the draws, naming the fix (torch's own error names
    neither the generator nor the helper)."""
    if generator is None:
        return
    have, want = generator.device, torch.device(device)
    if have.type != want.type or (want.index is not None and have.index not in (None, want.index)):
        raise ValueError(f"a random generator on {have} cannot draw on {want}: make it with "
                         f"trainer.sampling.seeded_generator(seed, {str(want)!r})")


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One draw per row of a (..., V) probability tensor."""
    check_generator(generator, probs.device)
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).view(probs.shape[:-1])


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(p - q, 0)); p itself when q covers p everywhere (then rejection had probability 0)."""
    residual = (p - q).clamp_min(0)
    total = residual.sum(-1, keepdim=True)
    return torch.where(total > 0, residual / total.clamp_min(torch.finfo(residual.dtype).tiny), p)


def rejection_sample(drafts: torch.Tensor, p: torch.Tensor, q: torch.Tensor,
                     generator: torch.Generator | None = None) -> tuple[int, int]:
    """drafts: (L,); p: (L + 1, V) target probabilities; q: (L, V) proposal probabilities.

    Returns (number of drafts accepted, the token emitted after them).
    """
    length = drafts.shape[0]
    p_draft = p[:length].gather(-1, drafts[:, None])[:, 0]
    q_draft = q.gather(-1, drafts[:, None])[:, 0]
    check_generator(generator, p.device)
    u = torch.rand(length, generator=generator, device=p.device)
    accepted = int((u * q_draft < p_draft).int().cumprod(0).sum())
    if accepted == length:
        return accepted, int(sample(p[length], generator))
    return accepted, int(sample(residual_distribution(p[accepted], q[accepted]), generator))
