"""The Triton kernels (kernels/triton_*.py) against the torch path: correctness, speed, and a drafter training step.
(Named kernel_bench, not kernels: run by path, a script has bench/ first on sys.path, where a kernels.py would
shadow the package.)

    .venv/bin/python -m bench.kernel_bench                 # CPU: a correctness run (Triton's interpreter) + torch timings
    .venv/bin/python -m bench.kernel_bench --device cuda   # GPU: each kernel's speed, Triton vs torch, and the training
                                                      # step's tokens/s and MFU with and without the kernels

On a CPU, Triton runs only in its interpreter (TRITON_INTERPRET=1, set here before triton loads): numbers there
are correctness only, so the Triton side is checked, not timed, and only the torch path is timed. On a GPU the
public ops in kernels/ dispatch to Triton with DRAFTSMITH_TRITON_KERNELS=1 (opt-in until measured here), and 0 is
the "without" column. Errors are max |triton - torch| / max |torch| over the output and every gradient.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time

ARGS = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ARGS.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
ARGS.add_argument("--repeats", type=int, default=None, help="timed repetitions (default: 3 on CPU, 20 on GPU)")
ARGS.add_argument("--peak-tflops", type=float, default=None,
                  help="bf16 dense peak for MFU (default: 989 on an H100/H200, else MFU is not printed)")
ARGS.add_argument("--skip-step", action="store_true", help="kernels only, no training step")
OPTIONS = ARGS.parse_args()
if OPTIONS.device == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton.language

import torch  # noqa: E402

from kernels import dynamic_conv, linear_cross_entropy, selector  # noqa: E402
from kernels._triton import ENV  # noqa: E402

DEVICE = torch.device(OPTIONS.device)
CUDA = DEVICE.type == "cuda"
REPEATS = OPTIONS.repeats or (20 if CUDA else 3)


def sync():
    if CUDA:
        torch.cuda.synchronize()


def timed(fn) -> float:
    """Median milliseconds of fn() over REPEATS runs, after one warm-up (Triton compiles on its first call)."""
    fn()
    sync()
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[len(times) // 2]


class torch_path:
    """Within this block the public ops take the torch path even for CUDA tensors."""

    def __enter__(self):
        self.before = os.environ.get(ENV)
        os.environ[ENV] = "0"

    def __exit__(self, *exc):
        os.environ.pop(ENV) if self.before is None else os.environ.__setitem__(ENV, self.before)


def fwd_bwd(call, inputs):
    """A forward and a backward with a fixed random upstream gradient; returns (output, grads)."""
    out = call(*inputs)
    main = out[0] if isinstance(out, tuple) else out
    upstream = torch.randn(main.shape, generator=torch.Generator().manual_seed(0)).to(main.device, main.dtype)
    grads = torch.autograd.grad(main, [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad],
                                upstream)
    return main.detach(), grads


def rel_error(ours, theirs) -> float:
    worst = 0.0
    for a, b in zip(ours, theirs, strict=True):
        worst = max(worst, float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-12)))
    return worst


# ---------------------------------------------------------------- the three ops, at a given scale


def conv_case(rows, length, hidden, dtype):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(rows, length, hidden, generator=g).to(DEVICE, dtype).requires_grad_()
    delta = (0.1 * torch.randn(rows, length, 2, hidden // 16, generator=g)).to(DEVICE, dtype).requires_grad_()
    base = torch.randn(2, hidden, generator=g).to(DEVICE).requires_grad_()
    return "dynamic conv", f"{rows}x{length}x{hidden}", \
        (lambda *t: dynamic_conv.grouped_dynamic_conv(*t, 16)), [x, delta, base], "triton_dynamic_conv", \
        (lambda m, *t: m.triton_grouped_dynamic_conv(*t, 16))


def selector_case(positions, vocab, dtype):
    g = torch.Generator().manual_seed(2)
    unary = torch.randn(positions, 16, generator=g).to(DEVICE, dtype).requires_grad_()
    candidates = torch.randint(0, vocab, (positions, 16), generator=g).to(DEVICE)
    hidden = torch.randn(positions, 256, generator=g).to(DEVICE, dtype).requires_grad_()
    predecessors = torch.randint(0, vocab, (positions,), generator=g).to(DEVICE)
    books = [torch.randn(vocab, 256, generator=g).to(DEVICE, dtype).requires_grad_() for _ in range(2)]

    def call(u, h, a, b):
        return selector.edge_scores(u, candidates, h, predecessors, a, b)

    return "edge scores", f"P={positions} K=16 r=256 V={vocab}", call, [unary, hidden, *books], "triton_selector", \
        (lambda m, u, h, a, b: m.triton_edge_scores(u, candidates, h, predecessors, a, b))


def lce_case(rows, hidden, vocab, dtype):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(rows, hidden, generator=g).to(DEVICE, dtype).requires_grad_()
    head = (torch.randn(vocab, hidden, generator=g) / hidden ** 0.5).to(DEVICE, dtype)
    labels = torch.randint(0, vocab, (rows,), generator=g).to(DEVICE)
    return "linear CE", f"{rows}x{hidden} V={vocab} top16", \
        (lambda h: linear_cross_entropy.row_cross_entropy(h, head, labels, 16)), [x], "triton_linear_cross_entropy", \
        (lambda m, h: m.triton_row_cross_entropy(h, head, labels, 16))


def kernels_report():
    import importlib

    small = [conv_case(6, 16, 64, torch.float32), conv_case(6, 16, 64, torch.bfloat16),
             selector_case(12, 500, torch.float32), selector_case(12, 500, torch.bfloat16),
             lce_case(24, 32, 300, torch.float32), lce_case(24, 32, 300, torch.bfloat16)]
    if CUDA:
        big = [conv_case(1536 // 16 * 8, 16, 4096, torch.bfloat16), selector_case(12288, 151936, torch.bfloat16),
               lce_case(12288, 4096, 32768, torch.bfloat16), lce_case(4096, 4096, 151936, torch.bfloat16)]
    else:
        big = [conv_case(96, 16, 576, torch.float32), selector_case(1536, 49152, torch.float32),
               lce_case(1536, 576, 8192, torch.float32)]
    print(f"== kernels ({'GPU timing' if CUDA else 'CPU: Triton in its interpreter, correctness only'})")
    print(f"{'op':14} {'shape':30} {'dtype':9} {'rel err':>9} {'torch ms':>10} {'triton ms':>10} {'speed-up':>8}")
    for cases, timing in ((small, False), (big, True)):
        for name, shape, call, inputs, module_name, direct in cases:
            dtype = str(inputs[0].dtype).replace("torch.", "")
            line = f"{name:14} {shape:30} {dtype:9}"
            if CUDA or not timing:  # the interpreter would take minutes on the large shapes
                module = importlib.import_module(f"kernels.{module_name}")
                with torch_path():
                    reference = fwd_bwd(call, inputs)
                ours = fwd_bwd(lambda *t: direct(module, *t), inputs)
                line += f" {rel_error([ours[0], *ours[1]], [reference[0], *reference[1]]):9.2e}"
            else:
                line += f" {'-':>9}"
            if timing:
                with torch_path():
                    torch_ms = timed(lambda: fwd_bwd(call, inputs))
                line += f" {torch_ms:10.2f}"
                if CUDA:
                    triton_ms = timed(lambda: fwd_bwd(call, inputs))  # dispatches to Triton on CUDA
                    line += f" {triton_ms:10.2f} {torch_ms / triton_ms:7.2f}x"
                else:
                    line += f" {'(interp.)':>10}"
            print(line, flush=True)
    print("  (times: forward + backward, median of", REPEATS, "runs; rel err: worst of output and gradients)")


# ---------------------------------------------------------------- the drafter training step


def training_step_report():
    from trainer.drafter.config import DrafterConfig
    from trainer.drafter.model import Drafter
    from trainer.training.blocks import build_blocks
    from trainer.training.objective import DistillationObjective, FrozenTargetParts

    if CUDA:  # a Qwen3-8B-shaped drafter layer pair, 16 sequences of 2k tokens, 32 anchors each, block 16
        shape = dict(hidden_size=4096, intermediate_size=12288, num_layers=2, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, vocab_size=151936)
        batch_size, width, anchors, block = 8, 2048, 32, 16
    else:  # small enough for 2 cores
        shape = dict(hidden_size=256, intermediate_size=512, num_layers=1, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=64, vocab_size=8192)
        batch_size, width, anchors, block = 2, 256, 16, 8
    config = DrafterConfig(variant="dflash2", rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=32768,
                           num_target_layers=36, target_layer_ids=(1, 17, 33), block_size=block,
                           mask_token_id=5, **shape)
    hidden, vocab, taps = config.hidden_size, config.vocab_size, len(config.target_layer_ids)
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(0, vocab, (batch_size, width), generator=g)
    context = torch.randn(batch_size, width, taps * hidden, generator=g)
    batch = build_blocks(ids, torch.full((batch_size,), width), torch.full((batch_size,), 16), context,
                         block_size=block, num_anchors=anchors, mask_token_id=5, decay_gamma=7.0, generator=g)
    batch = dataclasses.replace(batch, **{f.name: getattr(batch, f.name).to(DEVICE) for f in dataclasses.fields(batch)
                                          if isinstance(getattr(batch, f.name), torch.Tensor)})
    frozen = FrozenTargetParts(embedding=(0.02 * torch.randn(vocab, hidden, generator=g)).to(DEVICE),
                               lm_head=(0.02 * torch.randn(vocab, hidden, generator=g)).to(DEVICE))
    drafter = Drafter(config).to(DEVICE)
    objective = DistillationObjective(drafter, frozen, bf16_matmuls=CUDA)
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=1e-4)

    def step():
        optimizer.zero_grad(set_to_none=True)
        objective(batch)["loss"].backward()
        optimizer.step()

    queries = batch.block_ids.numel()
    supervised = batch.supervised_positions
    # Model FLOPs (no recompute counted): 6 per weight per token for the trained matmuls (block tokens through the
    # layers; context tokens through fc and every layer's k/v), attention 4 * Q * (S + Q) * heads * head_dim per
    # layer forward (x3 with backward), and the frozen LM head 4 * V * H per supervised row (forward + grad hidden).
    c = config
    layer = (c.hidden_size * c.head_dim * (2 * c.num_attention_heads + 2 * c.num_key_value_heads)
             + 3 * c.hidden_size * c.intermediate_size + 2 * 2 * 2 * (c.hidden_size // 16) * c.hidden_size)
    kv = c.hidden_size * c.head_dim * 2 * c.num_key_value_heads
    flops = (6 * layer * c.num_layers * queries + 6 * taps * hidden * hidden * batch_size * width
             + 6 * kv * c.num_layers * batch_size * width
             + 3 * 4 * c.num_layers * queries * (width + queries // batch_size) * c.num_attention_heads * c.head_dim
             + 4 * vocab * hidden * supervised)
    peak = OPTIONS.peak_tflops
    if peak is None and CUDA and any(n in torch.cuda.get_device_name() for n in ("H100", "H200")):
        peak = 989.0
    print(f"\n== drafter training step (dflash2, H={hidden}, {c.num_layers} layers, V={vocab}, "
          f"{batch_size}x{width} tokens, {queries} block tokens, {supervised} supervised)")
    runs = [("torch path", torch_path)]
    if CUDA:
        runs.append(("with kernels", _KernelsOn))
    else:
        print("  CPU: the kernels would run in Triton's interpreter, so only the torch path is timed")
    for label, context_manager in runs:
        with context_manager():
            ms = timed(step)
        line = f"  {label:13} {ms:9.1f} ms/step  {queries / ms * 1e3:10.0f} block tokens/s"
        line += f"  {flops / ms / 1e9:8.2f} model TFLOP/s"
        if peak:
            line += f"  MFU {flops / ms / 1e9 / peak:6.1%}"
        print(line, flush=True)


class _KernelsOn:
    def __enter__(self):  # the kernels on: they are opt-in (kernels/_triton.py)
        os.environ[ENV] = "1"

    def __exit__(self, *exc):
        pass


if __name__ == "__main__":
    started = time.perf_counter()
    print(f"device: {torch.cuda.get_device_name() if CUDA else 'cpu'}; torch {torch.__version__}")
    kernels_report()
    if not OPTIONS.skip_step:
        training_step_report()
    print(f"\n({time.perf_counter() - started:.1f} s)")
