"""A draft vocabulary: the drafter proposes only among the target's most frequent tokens.

On a CPU the drafter's LM head (hidden x 49k for SmolLM2, over B-1 positions) costs more than the whole
rest of a drafting pass, yet the tokens a target actually emits are a small, Zipf-shaped part of its
vocabulary. Drafting over the N most frequent tokens of the regenerated responses cuts that matmul by
vocab/N and loses only the drafts whose right answer lies outside the N (the verify pass still runs over
the full vocabulary, so the output is unchanged: greedy exactly, sampling in distribution, since the
proposal q is a proper distribution that is 0 outside the draft vocabulary).

Stored next to the drafter as `draft_vocab.safetensors` in the EAGLE-3 convention that vLLM and
llama.cpp read: `d2t` (int64, draft id -> target id offset: target = draft + d2t[draft]) and `t2d`
(bool over the target vocabulary). The reference-format `model.safetensors` is untouched, so engines
without a draft vocabulary (SGLang, the `dflash` package) use the full head.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from trainer.atomic import atomic_path
from trainer.errors import DrafterError

FILE_NAME = "draft_vocab.safetensors"


def frequency_ranked_vocab(responses: list[list[int]], vocab_size: int, size: int,
                           always: list[int] = ()) -> torch.Tensor:
    """The `size` most frequent tokens of `responses` (ties by id) plus `always` (e.g. stop tokens), as
    sorted target ids. When fewer distinct tokens were seen, the rest is filled with the lowest unseen ids."""
    size = min(size, vocab_size)
    counts = Counter(token for response in responses for token in response)
    chosen = list(dict.fromkeys(list(always) + [t for t, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]))
    chosen = chosen[:size]
    if len(chosen) < size:
        taken = set(chosen)
        chosen += [t for t in range(vocab_size) if t not in taken][:size - len(chosen)]
    return torch.tensor(sorted(chosen), dtype=torch.long)


def coverage(responses: list[list[int]], ids: torch.Tensor) -> float:
    """Share of the response tokens inside the draft vocabulary."""
    members = set(ids.tolist())
    total = sum(len(r) for r in responses)
    return sum(t in members for r in responses for t in r) / max(1, total)


def save_draft_vocab(ids: torch.Tensor, vocab_size: int, out_dir: str | Path) -> Path:
    ids = ids.to(torch.long).sort().values
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[ids] = True
    path = Path(out_dir) / FILE_NAME
    with atomic_path(path) as tmp:
        save_file({"d2t": (ids - torch.arange(len(ids))).contiguous(), "t2d": t2d}, tmp)
    return path


def load_draft_vocab(drafter_dir: str | Path) -> torch.Tensor | None:
    """Sorted target ids of the draft vocabulary, or None when the drafter has none."""
    path = Path(drafter_dir) / FILE_NAME
    if not path.is_file():
        return None
    tensors = load_file(path)
    d2t = tensors["d2t"].to(torch.long)
    ids = torch.arange(len(d2t)) + d2t
    if not torch.equal(tensors["t2d"].nonzero()[:, 0], ids):
        raise DrafterError(f"{path}: d2t and t2d disagree")
    return ids


def ids_from_d2t(d2t: torch.Tensor, vocab_size: int, source: str) -> torch.Tensor:
    """Sorted target ids from a `d2t` offset table; refuses one that is not a strictly increasing map into the
    vocabulary (what training always writes, and what vLLM's scatter of the draft logits assumes)."""
    ids = torch.arange(len(d2t)) + d2t.to(torch.long)
    if len(ids) and (int(ids[0]) < 0 or int(ids[-1]) >= vocab_size or bool((ids[1:] <= ids[:-1]).any())):
        raise DrafterError(f"{source}: d2t does not map the draft ids to distinct, sorted target ids below "
                           f"{vocab_size}; export the drafter again")
    return ids
