"""Publishing formats for trained drafters: GGUF for llama.cpp (written exactly as llama.cpp's own
converter writes it, and read back into the reference model for checking), and the drafter's record as an older
export's files give it (for the worker's publish of a job exported before drafter-record.json existed)."""

from trainer.export.gguf_reader import read_gguf_drafter
from trainer.export.gguf_writer import write_gguf
from trainer.export.record import record_of_export

__all__ = ["read_gguf_drafter", "record_of_export", "write_gguf"]
