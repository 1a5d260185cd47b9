"""Feeding the trainer: a deterministic order of examples, micro-batches per process, and the target
features of each batch (from the cache, or recomputed with the target when they were not cached)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from trainer.data.store import Example
from trainer.targets.loading import Target


class ExampleOrder:
    """Which examples make up micro-batch `micro` of step `step` on `rank`: a pure function of its
    arguments (epoch permutations from the seed), so a resumed run sees exactly the same data.

    `examples` is any sequence: the store's lazy ExampleIndex in training (loaded a shard at a time, so memory
    does not grow with the data set), or a list. Only the current epoch's permutation is kept, as a tensor."""

    def __init__(self, examples: Sequence[Example], seed: int, rank: int, world: int, micro_batch: int, accum: int):
        if not len(examples):
            raise ValueError("no training examples")
        self.examples, self.seed = examples, seed
        self.rank, self.world, self.micro_batch, self.accum = rank, world, micro_batch, accum
        self._epoch, self._permutation = -1, torch.empty(0, dtype=torch.long)

    def _at(self, global_index: int) -> Example:
        epoch, offset = divmod(global_index, len(self.examples))
        if epoch != self._epoch:
            generator = torch.Generator().manual_seed(self.seed * 7919 + epoch)
            self._epoch, self._permutation = epoch, torch.randperm(len(self.examples), generator=generator)
        return self.examples[int(self._permutation[offset])]

    def micro_batch_examples(self, step: int, micro: int) -> list[Example]:
        per_step = self.world * self.micro_batch * self.accum
        start = step * per_step + (micro * self.world + self.rank) * self.micro_batch
        return [self._at(start + i) for i in range(self.micro_batch)]

    def epochs_at(self, step: int) -> float:
        return step * self.world * self.micro_batch * self.accum / len(self.examples)


def collate_teacher(examples: list[Example], width: int) -> dict[str, torch.Tensor] | None:
    """The teacher signal laid out by the position of the token it predicts: row t of each tensor is the
    target's prediction of token t (defined on response tokens; zeros elsewhere). None unless every
    example carries one."""
    if not examples or any(e.teacher is None for e in examples):
        return None
    first = examples[0].teacher
    top_k, hidden = first.ids.shape[1], first.final_hidden.shape[1]
    out = {"ids": torch.zeros(len(examples), width, top_k, dtype=torch.long),
           "logits": torch.zeros(len(examples), width, top_k),
           "final": torch.zeros(len(examples), width, hidden)}
    for row, example in enumerate(examples):
        teacher, start = example.teacher, example.prompt_len
        count = min(teacher.ids.shape[0], len(example.input_ids) - start)
        out["ids"][row, start:start + count] = teacher.ids[:count].long()
        out["logits"][row, start:start + count] = teacher.logits[:count].float()
        out["final"][row, start:start + count] = teacher.final_hidden[:count].float()
    return out


def collate(examples: list[Example], pad_id: int, target: Target | None, tap_layer_ids: list[int]):
    """(input_ids (b, S) right-padded, lengths, prompt_lens, context (b, S, taps*H) float32, teacher signal
    (collate_teacher) or None)."""
    width = max(len(e.input_ids) for e in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    for row, example in enumerate(examples):
        input_ids[row, :len(example.input_ids)] = torch.tensor(example.input_ids)
    lengths = torch.tensor([len(e.input_ids) for e in examples])
    prompt_lens = torch.tensor([e.prompt_len for e in examples])
    if examples[0].hidden is not None:
        context = torch.zeros(len(examples), width, examples[0].hidden.shape[-1])
        for row, example in enumerate(examples):
            context[row, :example.hidden.shape[0]] = example.hidden.float()
    else:
        # Online: one no-grad target pass. Right padding never changes the real positions' features.
        attention = (torch.arange(width)[None] < lengths[:, None]).long()
        _, taps = target.forward(input_ids.to(target.device), attention_mask=attention.to(target.device),
                                 tap_layer_ids=tap_layer_ids)
        context = taps.float().cpu()
    return input_ids, lengths, prompt_lens, context, collate_teacher(examples, width)
