"""Run vLLM `speculators` 0.9.0's trainer on a CPU, in-process, with the few run-time overrides it needs there.

Executed with the speculators venv's python by bench/peers/speculators_peer.py (never imported by the project):

    .engines/speculators/bin/python bench/peers/speculators_launch.py --speculator-type dflash ... (speculators' flags)

Its installed sources are not edited; each override below replaces one attribute before the peer's own entry point
(`speculators.train.cli.main(TrainConfig.resolve(argv))`, what `speculators train` runs) is called.
"""

import json
import logging
import math
import os
import sys

import speculators.train.cli as cli_module
import speculators.train.trainer as trainer_module
import torch
from speculators.train.config import TrainConfig

# 1. Device. Its Trainer puts the model and every batch on `get_local_rank()` (an int, i.e. a CUDA device index):
#    here the CPU.
trainer_module.get_local_rank = lambda: "cpu"

# 2. Synchronisation. Its step timer calls torch.accelerator.synchronize() on every logged step, which has
#    nothing to wait for (and no device to ask) on a CPU.
_synchronize = torch.accelerator.synchronize
torch.accelerator.synchronize = lambda *a, **k: _synchronize(*a, **k) if torch.accelerator.is_available() else None

_init = trainer_module.Trainer.__init__
_train_epoch = trainer_module.Trainer.train_epoch


def _trainer_init(self, model, config, *args, **kwargs):
    _init(self, model, config, *args, **kwargs)
    # 3. Autocast device. With no accelerator it falls back to "cuda", and autocast("cuda") on a CPU switches
    #    itself off: the run would be float32 instead of its bfloat16 autocast (--hidden-states-dtype).
    self.device_type = "cpu"
    # 4. Epoch count. --max-steps ends an epoch early but the epoch loop goes on, so every epoch past the one
    #    that reached it would still run one more step (and a validation pass): keep just enough epochs.
    if self.config.max_steps is not None and len(self.train_loader):
        needed = math.ceil(self.config.max_steps / len(self.train_loader))
        self.config = self.config._replace(num_epochs=min(self.config.num_epochs, needed))


def _guarded_train_epoch(self, epoch, **kwargs):
    # 4 (cont.). An epoch whose packing gives fewer batches than epoch 0 can still leave one over: no step there.
    if self.config.max_steps is not None and self.global_step >= self.config.max_steps:
        return None
    return _train_epoch(self, epoch, **kwargs)


trainer_module.Trainer.__init__ = _trainer_init
trainer_module.Trainer.train_epoch = _guarded_train_epoch

# 5. Alignment, only for bench rows that run our schedule (bench.peers.peer_run.OUR_SCHEDULE); its CLI has no flag for
#    either. AdamW betas (it always uses torch's default 0.9/0.999) and a cosine that ends at a floor (its cosine
#    ends at 0).
if os.environ.get("SPECULATORS_ADAMW_BETAS"):
    betas = tuple(float(b) for b in os.environ["SPECULATORS_ADAMW_BETAS"].split(","))
    _adamw = torch.optim.AdamW

    class _AdamW(_adamw):
        def __init__(self, params, *args, **kwargs):
            kwargs.setdefault("betas", betas)
            super().__init__(params, *args, **kwargs)

    torch.optim.AdamW = _AdamW  # speculators.train.optimizers reads torch.optim.AdamW when it builds one
if os.environ.get("SPECULATORS_COSINE_MIN_LR_RATIO"):
    from transformers.optimization import get_cosine_with_min_lr_schedule_with_warmup

    min_lr_rate = float(os.environ["SPECULATORS_COSINE_MIN_LR_RATIO"])

    def _cosine(optimizer, num_warmup_steps, num_training_steps, num_cycles=0.5, last_epoch=-1):
        return get_cosine_with_min_lr_schedule_with_warmup(
            optimizer, num_warmup_steps, num_training_steps, num_cycles=num_cycles, last_epoch=last_epoch,
            min_lr_rate=min_lr_rate)

    trainer_module.get_cosine_schedule_with_warmup = _cosine

# 6. Precision of Muon's orthogonalisation, only for float32 rows (bench.peers.peer_run.PEER_DTYPES): torch.optim.Muon
#    runs its Newton-Schulz iteration in bfloat16, which a CPU without bfloat16 units emulates (185 s of a
#    232 s step on an AVX2 EPYC). The same quintic iteration, in float32.
def _newton_schulz_float32(grad, ns_coefficients, ns_steps, eps):
    a, b, c = ns_coefficients
    wide = grad.size(0) > grad.size(1)
    ortho = (grad.T if wide else grad).float()
    ortho = ortho / ortho.norm().clamp(min=eps)
    for _ in range(ns_steps):
        gram = ortho @ ortho.T
        ortho = a * ortho + (b * gram + c * gram @ gram) @ ortho
    return ortho.T if wide else ortho


if os.environ.get("SPECULATORS_FLOAT32_MUON"):
    import torch.optim._muon as muon_module

    muon_module._zeropower_via_newtonschulz = _newton_schulz_float32


# 7. Observability only: every train/val metrics record also goes, as one JSON line, to $SPECULATORS_METRICS_JSONL
#    (its console logger pretty-prints dicts over several lines). Added after its own logging setup, which resets
#    the metrics logger's handlers.
class _JsonLines(logging.Handler):
    def emit(self, record):
        if isinstance(record.msg, dict) and ("train" in record.msg or "val" in record.msg):
            with open(os.environ["SPECULATORS_METRICS_JSONL"], "a") as out:
                out.write(json.dumps(record.msg, default=str) + "\n")


_setup_metric_logger = cli_module.setup_metric_logger


def _metric_logger_with_jsonl(*args, **kwargs):
    _setup_metric_logger(*args, **kwargs)
    if os.environ.get("SPECULATORS_METRICS_JSONL"):
        logging.getLogger("speculators.metrics").addHandler(_JsonLines())


cli_module.setup_metric_logger = _metric_logger_with_jsonl

if __name__ == "__main__":
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    print("speculators_launch: cpu device, cpu autocast, no-op synchronize, epochs trimmed to --max-steps;",
          "adamw betas", os.environ.get("SPECULATORS_ADAMW_BETAS", "its default"), "| cosine floor",
          os.environ.get("SPECULATORS_COSINE_MIN_LR_RATIO", "its default"), "| muon",
          "float32" if os.environ.get("SPECULATORS_FLOAT32_MUON") else "its bfloat16", flush=True)
    cli_module.main(TrainConfig.resolve(sys.argv[1:]))
