"""Drafter checkpoints in the reference `dflash` format: config.json + model.safetensors (+ an optional
draft vocabulary, trainer/drafter/draft_vocab.py, that the reference format does not know: training's
`draft_vocab.safetensors` beside the weights, or an export's `d2t` + `lm_head.weight` inside them, as vLLM
reads it)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors.torch import save_file

from trainer.atomic import atomic_path, atomic_write_json
from trainer.drafter.config import DrafterConfig
from trainer.drafter.draft_vocab import ids_from_d2t  # noqa: F401 (read here by the export's tests)
from trainer.drafter.model import Drafter

# Released DFlash 2 checkpoints store the two codebooks without the `.weight` suffix.
RELEASED_NAMES = {
    f"candidate_selector.{name}.weight": f"candidate_selector.{name}"
    for name in ("predecessor_codebook", "successor_codebook")
}


def d2t_tensors(ids: torch.Tensor, head: torch.Tensor, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """A draft vocabulary as tensors of the drafter's own weight file, the way vLLM (and llama.cpp's converter)
    read it: `d2t` offsets (target id = draft id + d2t) and the drafter's own `lm_head.weight`, the target
    head's rows at the draft ids."""
    ids = ids.to(torch.long).sort().values
    return {"d2t": (ids - torch.arange(len(ids))).contiguous(),
            "lm_head.weight": head.detach()[ids].to(device="cpu", dtype=dtype).contiguous()}


def save_drafter(drafter: Drafter, out_dir: str | Path, dtype: torch.dtype = torch.float32) -> Path:
    """Write config.json and model.safetensors; each file appears whole or not at all."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {
        RELEASED_NAMES.get(name, name): tensor.detach().to(dtype=dtype, device="cpu").contiguous()
        for name, tensor in drafter.state_dict().items()
    }
    config = drafter.config.to_hf_dict() | {"dtype": str(dtype).removeprefix("torch.")}
    with atomic_path(out_dir / "model.safetensors") as tmp:
        save_file(tensors, tmp, metadata={"format": "pt"})
    atomic_write_json(out_dir / "config.json", config)
    return out_dir


def drafter_folder(path: str | Path) -> Path | None:
    """The drafter a folder holds: the folder itself when it is a drafter (config.json and *.safetensors), else
    its drafter/ when that is one (an exported artifact folder, as `draftsmith run`, the service and publishing
    write it), else None. The one resolver: the worker's warm starts and audits (worker/drafters.py),
    the trainer's warm start (trainer/job_config.py) and the audit (trainer/audit.py) all read a folder this way.

    Why this precedence. A reference names a directory; when that directory is itself a drafter it is what was
    named, and drafter/ is the convenience for an export folder (whose top level holds README.md, report.json,
    gguf/, never a config.json). Both parts of the test count: config.json alone is not a drafter, since a Hub
    repo's root or a target's directory holds one without drafter weights; taking it (trainer/job_config.py did)
    read a folder with no weights over the drafter under it. Taking drafter/ first (trainer/audit.py did) read a
    nested copy over the drafter the caller named. Before this helper the worker, the trainer and the audit could
    load different drafters from one folder; the worker's rule was the careful one, and is this one."""
    path = Path(path)
    names = [file.relative_to(path).as_posix() for folder in (path, path / "drafter") if folder.is_dir()
             for file in folder.iterdir() if file.is_file()]
    prefix = drafter_prefix(names)
    return None if prefix is None else path / prefix


def drafter_prefix(names: Iterable[str]) -> str | None:
    """`drafter_folder`'s rule on the names of a folder's files ('/'-separated, relative to it: an S3 listing, a
    Hub repo's): "" when the folder is a drafter, "drafter/" when its drafter/ is one, else None."""
    names = set(names)
    for prefix in ("", "drafter/"):
        if f"{prefix}config.json" in names and any(
                name.startswith(prefix) and name.endswith(".safetensors") and "/" not in name[len(prefix):]
                for name in names):
            return prefix
    return None


def read_drafter_config(path: str | Path, *, num_target_layers: int | None = None) -> DrafterConfig:
    """The shape of the drafter in `path`, in any format trainer/drafter/formats.py reads (config.json and the
    weights' headers only). `num_target_layers`: the target's depth, for a format that does not record it."""
    from trainer.drafter.formats import read_parent

    return read_parent(path, num_target_layers=num_target_layers).config


def load_drafter(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32, *,
                 num_target_layers: int | None = None) -> Drafter:
    """The drafter in `path`: ours, or a parent in a format of the field (z-lab's reference format, vLLM
    speculators', SpecForge's, a DSpark drafter's backbone), recognised by its content and converted tensor by
    tensor (trainer/drafter/formats.py); with its draft vocabulary (`drafter.draft_vocab`) when it has one."""
    from trainer.drafter.formats import import_drafter

    return import_drafter(path, num_target_layers=num_target_layers, device=device, dtype=dtype).drafter
