"""The one place where distribution is applied: DeepSpeed ZeRO around a plain PyTorch module (a plain torch
engine for an fp32 world of one: local_engine.py).

The same code runs as one process (no launcher), as N CPU processes (gloo) or on N GPUs (nccl), under
`torchrun` or `deepspeed`. The model and objective never know.
"""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist

# What a launcher (torchrun, deepspeed) tells each rank. A process that is not a rank must not carry them on: a
# world of one set up in this process (init_distributed) would otherwise leak its port to every child.
LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def init_distributed(device: torch.device | None = None) -> tuple[int, int, torch.device]:
    """(rank, world size, device). Without a launcher, sets up a world of one. `device`: where this rank's target
    was loaded (trainer/device.py decided it), so training runs there too (a job set to cpu trains on the CPU of a
    GPU machine); None: this rank's GPU when there is one."""
    import deepspeed

    if "RANK" not in os.environ:
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(_free_port()))
    cuda = torch.cuda.is_available() if device is None else device.type == "cuda"
    if not cuda:
        # DeepSpeed would JIT-compile its shared-memory all-reduce here (1-3 minutes on two cores, paid by the
        # first training of every fresh install). gloo's own all-reduce serves a CPU world: a drafter's
        # gradients are a few MB a step. Seeding the table also skips DeepSpeed's probe of every op (compiler
        # runs): an op missing from it counts as unavailable, and none is needed with a torch optimizer.
        deepspeed.ops.__dict__.setdefault("__compatible_ops__", {})["deepspeed_shm_comm"] = False
    if not dist.is_initialized():
        deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo", verbose=False)
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if device is None or device.type == "cuda" and device.index is None:
        device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    return dist.get_rank(), dist.get_world_size(), device


def deepspeed_config(zero_stage: int, micro_batch: int, grad_accum: int, grad_clip: float, bf16: bool) -> dict:
    return {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": grad_accum,
        "gradient_clipping": grad_clip,
        "bf16": {"enabled": bf16},
        "zero_optimization": {
            "stage": zero_stage,
            # Lets rank 0 write whole weights at export under ZeRO-3.
            "stage3_gather_16bit_weights_on_model_save": True,
        },
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def wrap(model: torch.nn.Module, optimizer, scheduler, config: dict):
    """The engine the loop steps: DeepSpeed's across processes or for bf16 weights (its fp32 master copy), a
    plain torch one for an fp32 world of one, where ZeRO has nothing to shard and only adds copies."""
    from trainer.training.local_engine import LocalEngine

    world = dist.get_world_size() if dist.is_initialized() else 1
    if world == 1 and not config["bf16"]["enabled"]:
        return LocalEngine(model, optimizer, scheduler, config["gradient_accumulation_steps"],
                           config["gradient_clipping"])
    return deepspeed_engine(model, optimizer, scheduler, config)


def deepspeed_engine(model: torch.nn.Module, optimizer, scheduler, config: dict):
    """A DeepSpeed engine. The optimizer is passed in as a torch object, which avoids compiling FusedAdam."""
    import deepspeed

    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler, config=config)
    return engine


def full_state_dict(engine) -> dict[str, torch.Tensor]:
    """The wrapped module's whole state dict on every rank, gathering ZeRO-3 partitions if needed."""
    import deepspeed

    module = engine.module
    if engine.zero_optimization_stage() == 3:
        with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
            return {k: v.detach().clone().cpu() for k, v in module.state_dict().items()}
    return {k: v.detach().cpu() for k, v in module.state_dict().items()}


def _reduce(values: torch.Tensor, op) -> torch.Tensor:
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return values
    # NCCL reduces GPU tensors only; gloo takes CPU tensors.
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    values = values.detach().to(device, torch.float32).clone()
    dist.all_reduce(values, op=op)
    return values.cpu()


def any_rank(flag: bool) -> bool:
    """True if any rank says True (e.g. 'out of time'), so every rank stops at the same step."""
    return bool(_reduce(torch.tensor([float(flag)]), dist.ReduceOp.MAX).item())


def maximum(value: float) -> float:
    """The largest of every rank's value (e.g. the slowest rank's clock)."""
    return float(_reduce(torch.tensor([float(value)]), dist.ReduceOp.MAX).item())


def average(values: torch.Tensor) -> torch.Tensor:
    world = dist.get_world_size() if dist.is_initialized() else 1
    return _reduce(values, dist.ReduceOp.SUM) / world


def barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
