from trainer.drafter.config import DrafterConfig, build_target_layer_ids
from trainer.drafter.model import Drafter, DrafterCache

__all__ = ["Drafter", "DrafterCache", "DrafterConfig", "build_target_layer_ids"]
