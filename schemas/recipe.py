"""The default recipe: the one source of every default that a REST job, `draftsmith run`, the bench and
the worker share, so the same inputs train the same drafter whichever way they arrive.

Pure constants (no torch): `schemas/job_spec.py` uses them as field defaults, `trainer/training/config.py`
and the CLI options read them, and `trainer/job_config.py` maps a JobSpec onto the trainer's settings.
The values are the CPU main job's (SmolLM2-135M on 2 cores in ~20 minutes); scale steps on GPUs.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

VARIANT: Final = "dflash2"
"""dflash2 (convolution taps + candidate selector) or dflash."""
BLOCK_SIZE = 8
"""Tokens per draft block: the anchor and B-1 drafted tokens."""
NUM_LAYERS = 2
"""Decoder layers of the drafter."""
MAX_NEW_TOKENS = 128
"""Tokens the target regenerates per training prompt."""
BUILTIN_PROMPTS = 256
"""Prompts a job draws from the built-in set (640) when data.count is not given, hold-out included: the main job's
generation in ~5 minutes on two slow CPU cores. Per token generated, long answers cost less than many
prompts (a prompt's prefill costs as much as ~40 decode steps of its batch), so the job keeps 128 tokens and
draws fewer prompts. Every category keeps its share (trainer/data/prompts.py `sample_prompts`)."""
HOLDOUT_SHARE = 0.11
"""Share of the prompts held out for validation."""
TRAIN_STEPS = 120
"""Optimizer steps: as many as fit TRAIN_MAX_MINUTES on two CPU cores at their slowest measured speed, so the
main job trains the same steps, and reaches the same tau, on a slow day as on a fast one (more steps buy tau:
450 gave 1.380 against 1.342 at 300, docs/RECIPE_STUDY.md `steps1.5x`; scale them on GPUs)."""
TRAIN_MAX_MINUTES: float | None = 6.0
"""Training's time budget (None: none). The learning-rate schedule follows the larger of step/steps and
elapsed/budget (trainer/training/schedule.py), so a machine too slow for the steps still ends its decay on time."""
WARMUP_STEPS = 30
"""Learning-rate warm-up steps of the CPU recipe (a job's training.warmup_share, when given, replaces them)."""
WARM_START_BUDGET_SHARE = 0.25
"""A specialisation's default training budget, as a share of a from-scratch job's: a warm start begins from a
parent that already drafts for the base, so it gets this share of the time-fitted schedule's steps and minutes (the
recipe's, or a preset's), with the same warm-up share, unless the job names its own (schemas/presets.py
`specialisation_budget`). The bench's goal for it: at 1/4 of the minutes, >= 1.10x a full from-scratch job's tau."""
DRAFTER_ADAPTER_ALPHA_PER_RANK = 2
"""A drafter adapter's LoRA alpha, as a multiple of its rank when the job gives none (training.drafter_adapter): the
update is scaled by alpha / rank, so a fixed ratio keeps the learning rate's meaning at every rank; 2 is the common
LoRA practice (peft's own default is a fixed alpha of 8, which would scale a rank-64 adapter's update 8x down)."""
DRAFTER_ADAPTER_RANK = 16
"""The rank bench/specialise.py trains its `adapter` rows at and the docs suggest. Not a job default: a job asks for an
adapter by naming its rank (`training.drafter_adapter: {"rank": N}`); without one every weight is trained."""
BF16_MATMULS = True
"""Train a float32 (CPU) target's drafter with bfloat16 matmuls and LM head (weights, optimizer and losses stay
float32): held-out tau unchanged, about 1.5x the steps per CPU second on CPUs with bfloat16 units. Used only where
bfloat16 pays off (trainer/training/objective.py `bf16_matmuls_pay_off`: an AVX2 CPU emulates it ~7x slower); a
no-op for bfloat16 targets (GPUs)."""
LEARNING_RATE = 2e-3
"""Peak AdamW learning rate (warm-up, then cosine decay)."""
ADAM_BETAS: Final = (0.9, 0.95)
"""AdamW's (beta1, beta2) (trainer/training/loop.py `make_optimizer`; torch's default beta2 is 0.999)."""
BATCH_SIZE = 16
"""Sequences per optimizer step (across all processes)."""
ANCHORS_PER_SEQUENCE = 12
"""Random draft blocks trained per sequence in one forward pass."""
DRAFT_VOCAB_SIZE: int | None = 8192
"""Tokens the trained drafter drafts among (the most frequent of the regenerated responses; verification
always uses the full vocabulary, so output is unchanged). On this CPU it cuts a block-8 draft from 43 to 11 ms
at the same held-out tau (1.380; 93 % of held-out tokens covered), docs/RECIPE_STUDY.md. The full head is
still exported for engines that read no draft vocabulary. None: the whole vocabulary."""
TRAIN_ON_DRAFT_VOCAB = True
"""Train the drafter's cross-entropy over the draft vocabulary's logits only (EAGLE-3's recipe) instead of the
full vocabulary's. The full head is most of a CPU training step: on this AVX2 machine a float32 step took 4.8 s
with it and 2.5 s without (2 threads, 2026-12-02). At equal steps it cost -0.028 tau [-0.045, -0.011]
(docs/RECIPE_STUDY.md `vocab-ce`); in a time budget it trains ~2x the steps."""
PositionWeighting = Literal["decay", "dpace"]
POSITION_WEIGHTINGS: tuple[PositionWeighting, ...] = get_args(PositionWeighting)
POSITION_WEIGHTING: PositionWeighting = "decay"
"""How block positions weigh in the drafter's loss: `decay` (the fixed exp(-(k-1)/gamma), the DFlash paper's) or
`dpace` (D-PACE: weights from the drafter's own confidence, trainer/training/position_weights.py). Chosen by the
recipe study (docs/RECIPE_STUDY.md `dpace*` rows): a change becomes the default only when its paired interval of
the held-out tau ratio lies above 1."""
DPACE_ALPHA = 0.5
"""D-PACE's smoothing q~ = (1 - alpha) q + alpha (the paper's default; stable in 0.3-0.7)."""
ACCEPTANCE_LOSS_WEIGHT = 0.0
"""Weight of the direct expected-acceptance term beside the cross-entropy (0: off)."""
GENERATION_SHARD_SIZE = 64
"""Prompts per regeneration shard: the unit the generate stage resumes from and spreads over workers
(DRAFTSMITH_WORKER_GENERATE_WORKERS). Each shard samples with its own seed, so the shard size is part of the data's
identity: the same seed and shard size give the same data on one worker or on many."""
ZERO_STAGE: Final = 2
"""DeepSpeed ZeRO stage: 2, or 3 for drafters too large to replicate."""
CHECKPOINT_EVERY = 200
"""Optimizer steps between resumable checkpoints (one is always written at the end and on cancellation)."""
SEED = 0
"""Seed of every random choice (prompt split, sampling, initialisation, data order)."""
VALIDATION_PROMPTS = 12
"""Held-out prompts decoded by validation (greedy exact match, acceptance, timing): 2 per category of the built-in
set, a timed subset of 4 (schemas/validation_plan.py). With 64 tokens each, ~4 minutes on two slow CPU cores (18
prompts of 96 tokens took 7.4 minutes at 9.5 target tokens/s, 2026-12-02)."""
VALIDATION_MAX_NEW_TOKENS = 64
"""Tokens generated per validation prompt."""
SAMPLING_DRAWS = 300
"""Draws of the speculative-sampling test, split evenly over its prompts."""
SAMPLING_PROMPTS = 6
"""Validation prompts the sampling test draws from (the first ones: one per category of the built-in set)."""
CONFIDENCE_BINS = 10
"""Equal-width bins of predicted acceptance over which validation's expected calibration error is read (the usual
ECE; 10 keeps a few hundred held-out positions per bin at the CPU defaults)."""
CONFIDENCE_MAX_KNOTS = 32
"""Most knots of a drafter's shipped confidence map (config.json `draftsmith.confidence`): isotonic regression can
leave one step per distinct score; adjacent steps are pooled, by weight, down to this many."""

# --- The GPU preset: the published DFlash recipe, scaled to a budget -------------------------------
# schemas/presets.py `choose_preset` lays these under what a user gives (`draftsmith run --preset gpu`); every
# constant above stays the CPU main job's, so `make run` (the cpu preset) trains exactly what it did.

GPU_NUM_LAYERS = 5
"""SpecForge's DFlash recipe for Qwen3-8B (DESIGN.md §6), and vLLM speculators' best practice."""
GPU_BLOCK_SIZE = 16
"""SpecForge's block; trainer/training/blocks.py `default_decay_gamma(16)` gives its loss decay gamma 7."""
GPU_ANCHORS_PER_SEQUENCE = 512
"""SpecForge's random anchors per sequence. A sequence with fewer valid positions (anchor and next token in the
response) trains all of them: trainer/training/blocks.py `sample_anchors` draws min(512, the batch's most)
and masks the rest of a shorter row."""
GPU_LEARNING_RATE = 6e-4
GPU_WARMUP_SHARE = 0.04
"""Warm-up as a share of the optimizer steps (training.warmup_share; the CPU job keeps its 30 steps)."""
GPU_EPOCHS = 6
"""Passes over the regenerated samples: the preset's training.max_steps is this many epochs of its prompts."""
GPU_MAX_NEW_TOKENS = 512
"""Longer generations than the CPU job's 128: more anchors per sequence, and answers as users get them."""
GPU_BATCH_SIZE = 8
"""Sequences per device per step: 8 x up to 512 anchors x 16 = 65k block tokens a step."""
GPU_GENERATION_BATCH_SIZE = 128
"""Prompts regenerated side by side (a run knob, not the job's: `--generation-batch-size`)."""
GPU_VALIDATION_PROMPTS = 24
"""Held-out prompts validation decodes on a GPU (each is checked speculatively there: DEVICES.md)."""
GPU_GENERATE_TOKENS_PER_S_1B = 2_000.0
"""Planning figure for regeneration with hidden-state capture, one GPU, a 1B target, batch 128 (our own
decode loop, not a serving engine); scales as 1/size."""
GPU_GENERATE_TOKENS_PER_S_MAX = 3_000.0
"""Small targets are launch-bound, not bandwidth-bound: the planning rate stops growing below ~0.7B. Both rates
are conservative guesses until a GPU check measures them: better a budget met with fewer prompts than overrun."""
GPU_GENERATE_SHARE = 0.3
"""Share of a budget (`budget_minutes`) planned for regeneration; it sets how many prompts the preset draws."""
GPU_TRAIN_SHARE = 0.4
"""Share of a budget that training may spend (training.max_minutes); the rest: loading, validation, export."""
GPU_MIN_PROMPTS = 64
"""Fewest prompts a budgeted GPU preset draws: below this the hold-out cannot measure tau."""
GPU_ASSUMED_TARGET_B = 8.0
"""Target size (billions of parameters) assumed when the caller does not know it (as api/estimates.py does)."""
