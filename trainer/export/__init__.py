"""Publishing formats for trained drafters: GGUF for llama.cpp (written exactly as llama.cpp's own
converter writes it, and read back into the reference model for checking)."""

from trainer.export.gguf_reader import read_gguf_drafter
from trainer.export.gguf_writer import write_gguf

__all__ = ["read_gguf_drafter", "write_gguf"]
