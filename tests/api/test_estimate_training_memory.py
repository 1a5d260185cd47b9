"""The estimate's training peak-memory figure (schemas/train_memory.py): typed, per preset and per GPU class, and
at the gpu preset dominated by what the fused attention no longer holds."""

from __future__ import annotations

import pytest

from api.estimates import estimate_job
from api.schemas import EstimateOut, TrainingMemoryEstimate
from schemas import recipe
from schemas.job_spec import JobSpec
from schemas.train_memory import reference_shape, training_memory


def estimate(uri: str, **spec) -> EstimateOut:
    return estimate_job(JobSpec.model_validate({"target": {"uri": uri}, **spec}), gpu_class=None, gpu_count=1,
                        target_parameters_billion=None)


def test_the_gpu_preset_for_smollm2_fits_because_attention_is_fused():
    out = estimate("bundled:smollm2-135m")
    gpu = next(p for p in out.presets if p.preset == "gpu")
    memory = gpu.training_memory
    assert isinstance(memory, TrainingMemoryEstimate) and memory.assumed_shape == "SmolLM2-135M"
    assert memory.block_queries == recipe.GPU_ANCHORS_PER_SEQUENCE * recipe.GPU_BLOCK_SIZE - recipe.GPU_BLOCK_SIZE
    # The math kernel's float32 scores: batch x heads x queries x keys x 4 bytes per layer (~20.7 GB each).
    per_layer = recipe.GPU_BATCH_SIZE * 9 * memory.block_queries * (memory.block_queries + memory.sequence_tokens) * 4
    assert per_layer / 1e9 == pytest.approx(20.7, abs=0.3)
    assert memory.math_attention_gb > recipe.GPU_NUM_LAYERS * per_layer / 1e9
    assert memory.attention_gb < 2.5 and memory.peak_gb < 16
    parts = (memory.target_weights_gb + memory.drafter_states_gb + memory.attention_gb + memory.activations_gb)
    assert memory.peak_gb == pytest.approx(parts, abs=0.05)
    by_class = {e.gpu_class: e for e in gpu.estimates}
    assert by_class["h100-80gb"].training_fits and by_class["h100-80gb"].training_peak_memory_gb == memory.peak_gb
    assert any("training memory" in line for line in out.assumptions)


def test_memory_grows_with_the_job_and_zero_shards_the_drafter_state():
    small = estimate("hf://acme/support-llama-8b").training_memory
    longer = estimate("hf://acme/support-llama-8b", sampling={"max_new_tokens": 512},
                      training={"anchors_per_sequence": 256}).training_memory
    assert longer.peak_gb > small.peak_gb and longer.attention_gb > small.attention_gb
    assert small.target_weights_gb == pytest.approx(16.0, rel=0.01)  # 8B in bfloat16
    float32 = estimate("hf://acme/support-llama-8b", compute={"dtype": "float32"}).training_memory
    assert float32.target_weights_gb == pytest.approx(2 * small.target_weights_gb)
    shape = reference_shape(8.0)
    sizes = dict(target_parameters_billion=8.0, dtype_bytes=2, num_layers=2, block_size=8, anchors_per_sequence=12,
                 batch_size=16, max_new_tokens=128, taps=3, dflash2=True, zero_stage=2)
    one, eight = training_memory(shape, gpu_count=1, **sizes), training_memory(shape, gpu_count=8, **sizes)
    assert eight.drafter_states_gb < one.drafter_states_gb / 2 and eight.target_weights_gb == one.target_weights_gb


def test_reference_shapes_are_chosen_by_size():
    assert reference_shape(0.135).name == "SmolLM2-135M"
    assert reference_shape(7.0).name == "Llama-3.1-8B"
    assert reference_shape(65.0).name == "Llama-3.1-70B"
