"""The model card's serving commands name the target as an engine loads it, never as our URI schemes spell it."""

from __future__ import annotations

from trainer.export.model_card import serving_model


def test_serving_commands_take_what_an_engine_can_load():
    assert serving_model("bundled:smollm2-135m") == serving_model("smollm2-135m") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert serving_model("hf://acme/support-llama@4f2a9c1") == "acme/support-llama"
    assert serving_model("file:///models/support-llama") == "/models/support-llama"
    assert serving_model("/models/support-llama") == "/models/support-llama"
    assert serving_model("s3://acme-models/support-llama/") == "TARGET"  # an engine reads no s3:// folder
