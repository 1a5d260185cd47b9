"""Teacher-forced capture: the target reads responses another engine wrote (a `ResponseBackend`) and records
what the built-in loop (`generate_batch`) records while it generates, in the same form.

One padded forward per batch over prompt + response[:-1] gives every tapped hidden state and, at the prompt's
last position and at each response token, the target's prediction of the next response token. The last
response token is never fed: the built-in loop stops there too, so stored taps cover input_ids[:-1].
"""

from __future__ import annotations

import torch

from trainer.data.regenerate import HIDDEN_DTYPE, DataError
from trainer.data.store import TeacherSignal
from trainer.targets.loading import Target


@torch.inference_mode()
def capture_batch(target: Target, prompt_ids: list[list[int]], responses: list[tuple[list[int], str]],
                  tap_layer_ids: list[int] | None, teacher_top_k: int,
                  ) -> list[tuple[list[int], torch.Tensor | None, str, TeacherSignal | None]]:
    """(response ids, taps of prompt+response[:-1], stop reason, teacher signal) per prompt: generate_batch's
    contract, for responses given rather than generated."""
    if len(prompt_ids) != len(responses):
        raise DataError(f"{len(responses)} responses for {len(prompt_ids)} prompts")
    if not prompt_ids:
        return []
    for response, reason in responses:
        if not response or reason not in ("stop", "length"):
            raise DataError(f"a response backend returned an unusable response ({len(response)} tokens, "
                            f"stop reason {reason!r}); every response needs at least one token and 'stop' or 'length'")
    taps = list(tap_layer_ids or [])
    # The final normed hidden state (the last layer's tap, Target.capture_taps) rides along as one more tap, as in
    # generate_batch's TeacherRecorder; the teacher logits are its LM-head image at the positions that predict
    # response tokens only, so the full-vocabulary logits of every prompt position are never materialised.
    layers = taps + ([target.num_layers - 1] if teacher_top_k else [])
    device, pad, width_h = target.device, target.tokenizer.pad_token_id or 0, target.hidden_size
    sequences = [prompt + response[:-1] for prompt, (response, _) in zip(prompt_ids, responses)]
    width = max(len(s) for s in sequences)
    # Right padding: every real token sits at its own position 0..len-1, exactly the positions generate_batch
    # gives it (left-padded, positions counting real tokens only), and causal attention never lets a real token
    # see the padding after it; the mask still keeps pads out of every padded query's softmax.
    input_ids = torch.tensor([s + [pad] * (width - len(s)) for s in sequences], device=device)
    attention = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in sequences], device=device)
    positions = torch.arange(width, device=device).expand(len(sequences), -1)
    # logits_to_keep=1: the model's own logits are not needed (see above); one column is the least it computes.
    _, hidden = target.forward(input_ids, positions, None, layers or None, logits_to_keep=1, attention_mask=attention)
    outputs, signals = [], []
    for row, (prompt, (response, reason)) in enumerate(zip(prompt_ids, responses)):
        states = hidden[row, :len(sequences[row])] if hidden is not None else None
        # copy=True: a bfloat16 target would otherwise hand back views that pin the whole batch's tensor.
        stored = states[:, :len(taps) * width_h].to(HIDDEN_DTYPE, copy=True) if taps else None
        if teacher_top_k:
            # Position len(prompt)-1 predicts response token 0; position len(prompt)-1+j predicts token j.
            final = states[len(prompt) - 1:, -width_h:]
            values, ids = target.lm_head(final).float().topk(teacher_top_k, dim=-1)
            signals.append((ids.to(torch.int32), values, final.to(HIDDEN_DTYPE)))
        outputs.append((list(response), stored, reason, None))
    if signals:  # to the host in one copy per kind for the batch, not three per row
        lengths = [len(ids) for ids, _, _ in signals]
        # Cloned apart on the host: views of one tensor would share (and pin) the batch's storage.
        ids, values, finals = ([piece.clone() for piece in torch.cat(kind).cpu().split(lengths)]
                               for kind in zip(*signals, strict=True))
        outputs = [(response, stored, reason, TeacherSignal(i, v, f))
                   for (response, stored, reason, _), i, v, f in zip(outputs, ids, values, finals, strict=True)]
    return outputs
