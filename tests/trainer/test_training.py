"""Distillation on a tiny target: the loss goes down, a resumed run continues exactly, and multi-process
ZeRO-2/ZeRO-3 runs on CPU produce a drafter the reference `dflash` package loads and runs."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch

from schemas.sampling import SamplingParams
from trainer.drafter.checkpoint import load_drafter
from trainer.drafter.config import DrafterConfig
from trainer.training.blocks import build_blocks
from trainer.training.config import TrainConfig
from trainer.training.loop import Trainer


def drafter_config(target, variant="dflash2"):
    return DrafterConfig.for_target(target, variant=variant, num_layers=1, block_size=4, mask_token_id=7,
                                    target_layer_ids=[1, 2, 3], selector_rank=8, selector_top_k=8)


def run(target, data, out, cfg, variant="dflash2", callbacks=(), resume=False):
    records = []
    trainer = Trainer(target, data, out, drafter_config(target, variant), cfg, [records.append, *callbacks])
    return trainer.run(resume=resume), records


def test_blocks_follow_the_inference_layout():
    ids = torch.tensor([[10, 11, 12, 13, 14, 15, 16, 0]])
    batch = build_blocks(ids, torch.tensor([7]), torch.tensor([2]), torch.zeros(1, 8, 3), block_size=3,
                         num_anchors=10, mask_token_id=99, decay_gamma=4.0, generator=torch.Generator())
    anchors = batch.block_positions.view(1, -1, 3)[0, :, 0].tolist()
    assert anchors == [2, 3, 4, 5]  # response tokens 2..6 whose next token is a response token too
    blocks = batch.block_ids.view(-1, 3)
    assert blocks[:, 0].tolist() == [12, 13, 14, 15] and bool((blocks[:, 1:] == 99).all())
    assert batch.labels[0, 0].tolist()[1:] == [13, 14]
    assert batch.predecessors[0, 0].tolist()[1:] == [12, 13]
    assert batch.weights[0, 0, 0] == 0 and batch.weights[0, 0, 1] == 1.0
    assert batch.weights[0, 3, 2] == 0  # anchor 5 + 2 = 7 is past the sequence end
    mask = batch.mask[0, 0]
    # Block of anchor 4 (queries 6..8): context 0..3 only, and its own block, bidirectionally.
    assert mask[6, :8].tolist() == [True] * 4 + [False] * 4
    assert mask[8, 8:].tolist() == [False] * 6 + [True] * 3 + [False] * 3


def test_teacher_signal_lines_up_with_the_labels(learnable_target, learnable_data):
    """Greedy data: the target's top-1 at the position that predicted a label is that label, and its final
    hidden state there is what its LM head turned into that prediction."""
    from trainer.training.data import collate

    examples = learnable_data.examples()[:4]
    input_ids, lengths, prompt_lens, context, teacher = collate(examples, 3, None, [1, 2, 3])
    batch = build_blocks(input_ids, lengths, prompt_lens, context, block_size=4, num_anchors=6, mask_token_id=7,
                         decay_gamma=4.0, generator=torch.Generator().manual_seed(0), teacher=teacher)
    supervised = batch.weights > 0
    assert supervised.sum() > 20
    assert torch.equal(batch.soft_ids[..., 0][supervised], batch.labels[supervised])
    logits = learnable_target.lm_head(batch.teacher_hidden[supervised])
    assert torch.equal(logits.argmax(-1), batch.labels[supervised])


@pytest.mark.parametrize("objective", [{"kl_weight": 0.5, "bf16_matmuls": False},
                                       {"hidden_loss_weight": 1.0, "bf16_matmuls": False},
                                       {"bf16_matmuls": True, "kl_weight": 0.5, "hidden_loss_weight": 1.0}])
def test_dense_supervision_and_bf16_matmuls_train(learnable_target, learnable_data, tmp_path, objective):
    cfg = TrainConfig(steps=30, batch_size=4, anchors_per_sequence=8, lr=3e-3, warmup_steps=2, init="random",
                      checkpoint_every=100, **objective)
    _, records = run(learnable_target, learnable_data, tmp_path, cfg)
    assert records[-1]["loss"] < 0.75 * records[0]["loss"]
    assert records[-1]["train_tau_estimate"] > records[0]["train_tau_estimate"]


def test_a_few_steps_lower_the_loss(learnable_target, learnable_data, tmp_path):
    cfg = TrainConfig(steps=40, batch_size=4, anchors_per_sequence=8, lr=3e-3, warmup_steps=2, init="random",
                      checkpoint_every=100)
    drafter_dir, records = run(learnable_target, learnable_data, tmp_path, cfg)
    # The cross-entropy term: the selector term only counts positions whose gold token is in the top-K,
    # so it grows as the drafter improves.
    first = sum(r["ce"] for r in records[:3]) / 3
    last = sum(r["ce"] for r in records[-3:]) / 3
    assert last < 0.75 * first
    assert records[-1]["train_tau_estimate"] > records[0]["train_tau_estimate"]
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, 41))
    assert {"loss", "lr", "tokens_per_s", "accuracy_per_position", "topk_recall"} <= set(metrics[0])
    assert load_drafter(drafter_dir).config.block_size == 4


def test_draft_vocabulary_is_ranked_written_and_exported(learnable_target, learnable_data, tmp_path):
    """A drafter configured with a draft vocabulary gets the most frequent regenerated tokens (stop tokens
    always), and greedy decoding with it stays the target's (export: tests/export/test_gguf.py)."""
    from trainer.speculative import SpeculativeDecoder

    config = drafter_config(learnable_target).replace(draft_vocab_size=40)
    cfg = TrainConfig(steps=3, batch_size=2, anchors_per_sequence=4, checkpoint_every=100, warmup_steps=1)
    drafter_dir = Trainer(learnable_target, learnable_data, tmp_path / "run", config, cfg).run()
    drafter = load_drafter(drafter_dir)
    responses = [e.input_ids[e.prompt_len:] for e in learnable_data.examples(with_hidden=False)]
    counts = torch.bincount(torch.tensor([t for r in responses for t in r]), minlength=learnable_target.vocab_size)
    assert len(drafter.draft_vocab) == 40 and set(learnable_target.stop_token_ids()) <= set(drafter.draft_vocab.tolist())
    outside = counts.clone()
    outside[drafter.draft_vocab] = -1
    assert int(counts[drafter.draft_vocab].sort().values[1]) >= int(outside.max())  # [0] may be a stop token
    greedy = SamplingParams(max_new_tokens=20)
    prompt = responses[0][:5]
    assert SpeculativeDecoder(learnable_target, drafter).generate(prompt, greedy).tokens == \
        SpeculativeDecoder(learnable_target).generate(prompt, greedy).tokens


class Crash(Exception):
    pass


@pytest.mark.parametrize("variant", ["dflash2", "dflash"])
def test_resume_reproduces_the_uninterrupted_run(learnable_target, learnable_data, tmp_path, variant):
    cfg = TrainConfig(steps=6, batch_size=2, anchors_per_sequence=4, checkpoint_every=3, warmup_steps=1)
    _, uninterrupted = run(learnable_target, learnable_data, tmp_path / "a", cfg, variant)

    def crash_at_step_5(record):
        if record["step"] == 5:
            raise Crash

    with pytest.raises(Crash):
        run(learnable_target, learnable_data, tmp_path / "b", cfg, variant, callbacks=[crash_at_step_5])
    _, resumed = run(learnable_target, learnable_data, tmp_path / "b", cfg, variant, resume=True)
    assert [r["step"] for r in resumed] == [4, 5, 6]
    for a, b in zip(uninterrupted[3:], resumed, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
    lines = (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3, 4, 5, 6]


def test_one_process_plain_engine_trains_as_deepspeed_does(learnable_target, learnable_data, tmp_path, monkeypatch):
    """A world of one steps a plain torch engine (trainer/training/local_engine.py); DeepSpeed's engine from the
    same start gives the same run: accumulation, clipping (0.05 binds here), schedule and export included."""
    from trainer.training import distributed

    cfg = TrainConfig(steps=6, batch_size=2, anchors_per_sequence=4, grad_accum=2, grad_clip=0.05, warmup_steps=1,
                      checkpoint_every=3, init="random", lr=2e-4)
    # A learning rate this small keeps six steps out of chaos: at 2e-3 a last-bit difference in the two engines'
    # clipping (a CPU's own kernels) grew to 6e-4 of the gradient norm by step 5 on an AMX Xeon.
    plain_dir, plain = run(learnable_target, learnable_data, tmp_path / "plain", cfg)
    assert (tmp_path / "plain" / "checkpoints" / "step-000006" / "state.pt").is_file()
    monkeypatch.setattr(distributed, "wrap", distributed.deepspeed_engine)
    reference_dir, reference = run(learnable_target, learnable_data, tmp_path / "deepspeed", cfg)
    assert not (tmp_path / "deepspeed" / "checkpoints" / "step-000006" / "state.pt").exists()
    assert min(r["grad_norm"] for r in reference) > cfg.grad_clip
    for a, b in zip(plain, reference, strict=True):
        assert (a["loss"], a["grad_norm"], a["lr"]) == pytest.approx((b["loss"], b["grad_norm"], b["lr"]), rel=1e-4)
    ours, theirs = load_drafter(plain_dir).state_dict(), load_drafter(reference_dir).state_dict()
    for name, value in ours.items():
        torch.testing.assert_close(value, theirs[name], rtol=1e-4, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("zero_stage", ["2", "3"])
def test_two_process_zero_runs_export_to_the_reference_format(learnable_target, learnable_data, tmp_path, zero_stage,
                                                              reference_dflash):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                             "MASTER_PORT")}
    env["TORCH_EXTENSIONS_DIR"] = str(tmp_path / "extensions")  # nothing may be compiled at first training
    command = [sys.executable, "-m", "draftsmith.cli", "train", "--target", str(learnable_target.path),
               "--data", str(learnable_data.root), "--out", str(tmp_path), "--num-layers", "1", "--block-size", "4",
               "--steps", "3", "--batch-size", "2", "--anchors", "4", "--zero-stage", zero_stage, "--nproc", "2",
               "--mask-token-id", "7"]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert not (tmp_path / "extensions").exists(), "DeepSpeed compiled an op at training time"
    checkpoint = tmp_path / "checkpoints" / "step-000003"
    assert (checkpoint / "zero_pp_rank_1_mp_rank_00_optim_states.pt").is_file()  # sharded across both ranks
    drafter = load_drafter(tmp_path / "drafter")
    reference = reference_dflash.DFlash2DraftModel.from_pretrained(tmp_path / "drafter", dtype=torch.float32).eval()
    for name, tensor in drafter.state_dict().items():
        assert torch.equal(tensor, reference.state_dict()[name]), name
    prompt = [12, 40, 41, 42]
    out = reference_dflash.dflash_generate(reference, learnable_target.model, torch.tensor([prompt]), 8, None)
    assert out.shape[1] == len(prompt) + 8


def objective_for(target, draft_ids=None, first_failure_only=False):
    from trainer.drafter.model import Drafter
    from trainer.training.objective import DistillationObjective, FrozenTargetParts

    torch.manual_seed(0)
    drafter = Drafter(drafter_config(target))
    frozen = FrozenTargetParts(target.embedding_weight, target.lm_head.weight)
    return DistillationObjective(drafter, frozen, draft_ids=draft_ids, first_failure_only=first_failure_only)


def tiny_batch(target, data):
    from trainer.training.data import collate

    input_ids, lengths, prompt_lens, context, _ = collate(data.examples()[:4], 3, None, [1, 2, 3])
    return build_blocks(input_ids, lengths, prompt_lens, context, block_size=4, num_anchors=6, mask_token_id=7,
                        decay_gamma=4.0, generator=torch.Generator().manual_seed(0))


def test_draft_vocabulary_training_is_the_full_objective_over_fewer_columns(learnable_target, learnable_data):
    """Over a draft vocabulary of every token the objective is the plain one, to rounding; over a smaller one,
    positions whose gold token is outside it drop out of the cross-entropy and predictions stay inside it."""
    batch = tiny_batch(learnable_target, learnable_data)
    plain = objective_for(learnable_target)(batch)
    every = objective_for(learnable_target, torch.arange(learnable_target.vocab_size))(batch)
    torch.testing.assert_close(every["loss"], plain["loss"])
    assert torch.equal(every["correct"], plain["correct"])

    labels = batch.labels.reshape(-1)[batch.weights.view(-1) > 0]
    common = torch.bincount(labels, minlength=learnable_target.vocab_size).argsort(descending=True)[:8].sort().values
    small = objective_for(learnable_target, common)
    out = small(batch)
    assert torch.isfinite(out["loss"])
    # Only the in-vocabulary positions carry the CE: the same loss as the plain objective on a batch whose
    # out-of-vocabulary positions were given no weight.
    outside = ~torch.isin(batch.labels, common)
    masked = dataclasses.replace(batch, weights=batch.weights.masked_fill(outside, 0.0))
    torch.testing.assert_close(out["ce"], objective_for(learnable_target, common)(masked)["ce"])
    assert not torch.allclose(out["ce"], plain["ce"])


def test_first_failure_weighting_stops_a_block_after_its_first_miss():
    from trainer.training.objective import reached

    weights = torch.tensor([[[0.0, 1.0, 0.8, 0.6, 0.4], [0.0, 1.0, 0.8, 0.0, 0.0]]])  # (b=1, N=2, B=5)
    batch = dataclasses.replace(tiny_layout := build_blocks(
        torch.arange(12)[None], torch.tensor([12]), torch.tensor([0]), torch.zeros(1, 12, 3), block_size=5,
        num_anchors=2, mask_token_id=99, decay_gamma=4.0, generator=torch.Generator()), weights=weights)
    assert tiny_layout.weights.shape == weights.shape
    supervised = weights.view(-1) > 0
    # Block 1: right, wrong, right, right -> positions 1 and 2 reached; block 2: wrong, right -> 1 only... and 2.
    correct = torch.tensor([True, False, True, True, False, True])
    assert reached(batch, supervised, correct).tolist() == [1.0, 1.0, 0.0, 0.0, 1.0, 0.0]


def test_a_time_budget_ends_the_run_with_its_decay_done(learnable_target, learnable_data, tmp_path):
    """Far more steps than the budget allows: training stops on the budget, at the schedule's floor. (A step
    takes 0.5 s of the trainer's clock here, whatever the machine's load.)"""
    cfg = TrainConfig(steps=100_000, batch_size=2, anchors_per_sequence=4, lr=3e-3, warmup_steps=2, min_lr_ratio=0.1,
                      max_minutes=0.05, checkpoint_every=10**6)
    records = []
    trainer = Trainer(learnable_target, learnable_data, tmp_path, drafter_config(learnable_target), cfg, [records.append])
    ticks = iter(range(10**6))
    trainer.clock = lambda: next(ticks) * 0.25  # two readings per step
    drafter_dir = trainer.run()
    assert len(records) == 6  # 3 s of budget at 0.5 s a step
    assert records[-1]["progress"] == 1.0 and records[-1]["budget_s"] == 3.0
    rates = [r["lr"] for r in records[2:]]  # after the warm-up: down, all the way to the floor
    assert rates == sorted(rates, reverse=True) and rates[-1] < 0.5 * 3e-3
    assert trainer.schedule.factor(len(records)) == pytest.approx(0.1)
    assert (drafter_dir / "model.safetensors").is_file()
