"""Distillation of a drafter from regenerated data: blocks, objective, DeepSpeed loop, checkpoints."""
