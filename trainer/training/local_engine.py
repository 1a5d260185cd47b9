"""A world of one without DeepSpeed: the same five calls the training loop makes on a DeepSpeed engine, done with a
plain torch optimizer.

Why: on one process ZeRO has nothing to shard, yet its step still copies every gradient into flat buffers, takes
the global norm over them and copies the parameters back: about a third of a 135M target's drafter step on two
CPU cores. fp32 weights only: bf16 keeps DeepSpeed, whose fp32 master weights a plain optimizer would lack.
The semantics are DeepSpeed's (tests/trainer/test_training.py runs both side by side): `backward` scales the
loss by 1/grad_accum, `step` acts on the accumulation boundary only (clip by the global norm, optimizer step,
zero the gradients, scheduler step), and checkpoints live in DIR/TAG with DIR/latest naming the newest.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from trainer.atomic import atomic_path, atomic_write_bytes

STATE_FILE = "state.pt"


class LocalEngine:
    def __init__(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 scheduler: torch.optim.lr_scheduler.LRScheduler, grad_accum: int, grad_clip: float):
        self.module, self.optimizer, self.scheduler = module, optimizer, scheduler
        self.grad_accum, self.grad_clip = grad_accum, grad_clip
        self.micro_steps = 0
        self.global_grad_norm: float | None = None
        self._parameters = [p for p in module.parameters() if p.requires_grad]

    def __call__(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def backward(self, loss: torch.Tensor) -> None:
        (loss / self.grad_accum if self.grad_accum > 1 else loss).backward()

    def step(self) -> None:
        self.micro_steps += 1
        if self.micro_steps % self.grad_accum:
            return
        # Clipping at 0 means none, as in DeepSpeed; the norm is recorded either way (before clipping).
        max_norm = self.grad_clip if self.grad_clip > 0 else float("inf")
        self.global_grad_norm = float(torch.nn.utils.clip_grad_norm_(self._parameters, max_norm, foreach=True))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()

    def get_global_grad_norm(self) -> float | None:
        return self.global_grad_norm

    def zero_optimization_stage(self) -> int:
        return 0

    def save_checkpoint(self, save_dir: str, tag: str, client_state: dict) -> None:
        folder = Path(save_dir) / tag
        folder.mkdir(parents=True, exist_ok=True)
        state = {"module": self.module.state_dict(), "optimizer": self.optimizer.state_dict(),
                 "scheduler": self.scheduler.state_dict(), "micro_steps": self.micro_steps,
                 "client_state": client_state}
        with atomic_path(folder / STATE_FILE) as part:
            torch.save(state, part)
        # Written last, as DeepSpeed does: a crash before it leaves the previous checkpoint the one to resume.
        atomic_write_bytes(Path(save_dir) / "latest", tag.encode())

    def load_checkpoint(self, load_dir: str, tag: str) -> tuple[str, dict]:
        path = os.path.join(load_dir, tag, STATE_FILE)
        state = torch.load(path, map_location="cpu", weights_only=True)
        self.module.load_state_dict(state["module"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.micro_steps = state["micro_steps"]
        return path, state["client_state"]
