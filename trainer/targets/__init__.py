from trainer.targets.families import SUPPORTED_MODEL_TYPES
from trainer.targets.loading import Target, inspect_target_dir, load_target

__all__ = ["SUPPORTED_MODEL_TYPES", "Target", "inspect_target_dir", "load_target"]
