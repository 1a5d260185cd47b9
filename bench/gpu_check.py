"""The GPU check's run and its table (bench/gpu_check.sh calls this; docs/DEVICES.md "Checking a GPU machine").

1. Draft/verify costs for a Llama-3.1-8B-shaped target with random weights built on the GPU in bfloat16 (no
   download) and a random 5-layer block-16 drafter (trainer/validation/report.py `measure_step_costs`); then the
   three Triton kernels against their torch references (bench/kernel_bench.py) where triton imports. What needs no
   data comes first.
2. `draftsmith run --target smollm2-135m --preset gpu --device cuda --budget-minutes 5` on the real SmolLM2-135M
   (sized to finish in under 8 minutes on one H200), unless --skip-run reads an earlier run's --out.
3. A table from what the run wrote (OUT/.work/state.json, train/metrics.jsonl, the drafter, report.json):
   generation tokens/s, training steps/s and the drafter training step's model-FLOPs utilisation, held-out tau,
   the draft/verify cost table, and our decoder's batch-1 tokens/s against the target alone with its interval.

Training FLOPs per second, the MFU numerator (attention scores and the context's fc/k/v projections left out:
a lower bound):
    6 x drafter parameters x block tokens/s  +  4 x hidden x LM-head rows x supervised positions/s
the drafter trains (forward 2 + backward 4 per parameter and token; the selector's codebooks are looked up, not
multiplied, and are left out); the frozen LM head (over the draft vocabulary when training uses it) runs forward
(2) and its input gradient (2), no weight gradient. Block tokens/s is the
supervised positions/s of metrics.jsonl x B/(B-1) (each block's anchor is not supervised). Peak: the H200's dense
bfloat16 989 TFLOP/s (--peak-tflops).

Every step's figures go to OUT/gpu_check.json as it finishes (`Findings`): a failure prints what finished and
the error, and a rerun into the same OUT keeps them, resumes the job's finished stages and does only the rest.

--dry-run: the same code paths on the CPU with tiny shapes (few prompts and steps, a tiny random Llama instead of
the 8B shape), in a few minutes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

H200_BF16_DENSE_TFLOPS = 989.0
LLAMA_8B_SHAPE = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                      intermediate_size=14336, vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0)
TINY_LLAMA_SHAPE = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                        intermediate_size=128, vocab_size=512, max_position_embeddings=1024, rope_theta=10000.0)
DRY_RUN_FLAGS = [  # over the gpu preset (flags win): the same stages, tiny
    "--device", "cpu", "--num-prompts", "27", "--max-new-tokens", "24", "--steps", "3", "--batch-size", "4",
    "--anchors", "8", "--num-layers", "1", "--generation-batch-size", "8", "--validation-prompts", "3",
    "--validation-max-new-tokens", "12", "--sampling-draws", "12", "--train-minutes", "2",
]


def run_job(out: Path, *, dry_run: bool, budget_minutes: float) -> float:
    """`draftsmith run` with the gpu preset, as a user types it; its wall-clock seconds."""
    command = [sys.executable, "-c", "from draftsmith.cli import main; main()", "run", "--target", "smollm2-135m",
               "--out", str(out), "--preset", "gpu", "--budget-minutes", str(budget_minutes)]
    command += DRY_RUN_FLAGS if dry_run else ["--device", "cuda"]
    if (out / ".work" / "state.json").is_file():  # an earlier call got this far: its finished stages are kept
        command.append("--resume")
    print("$", " ".join(command[3:]), flush=True)
    started = time.perf_counter()
    subprocess.run(command, check=True)
    return time.perf_counter() - started


def safetensors_shapes(path: Path) -> dict[str, list[int]]:
    """Tensor shapes of a safetensors file, from its header (nothing loaded)."""
    with path.open("rb") as handle:
        size = int.from_bytes(handle.read(8), "little")
        header = json.loads(handle.read(size))
    return {name: info["shape"] for name, info in header.items() if name != "__metadata__"}


def matmul_parameters(path: Path) -> int:
    """The drafter's parameters that every block token multiplies through: all but the selector's codebooks, which
    are looked up (top-K rows a position), not multiplied."""
    total = 0
    for name, shape in safetensors_shapes(path).items():
        if "codebook" not in name:
            count = 1
            for dim in shape:
                count *= dim
            total += count
    return total


def training_figures(work: Path, peak_tflops: float | None) -> dict:
    state = json.loads((work / "state.json").read_text())
    stages = state["stages"]
    records = [json.loads(line) for line in (work / "train" / "metrics.jsonl").read_text().splitlines()]
    drafter_dir = work / "train" / "drafter"
    config = json.loads((drafter_dir / "config.json").read_text())
    block = config.get("dflash_config", {}).get("block_size") or config["block_size"]
    hidden, head_rows = config["hidden_size"], config["vocab_size"]
    draft_vocab = drafter_dir / "draft_vocab.safetensors"
    if draft_vocab.is_file():  # training's cross-entropy runs over the draft vocabulary (recipe.TRAIN_ON_DRAFT_VOCAB)
        head_rows = safetensors_shapes(draft_vocab)["d2t"][0]  # draft id -> target id, one row each
    parameters = matmul_parameters(drafter_dir / "model.safetensors")
    steady = records[2:] or records  # the first steps include warm-up kernels and allocation
    supervised_per_s = statistics.median(record["tokens_per_s"] for record in steady)
    block_per_s = supervised_per_s * block / (block - 1)
    flops_per_s = 6 * parameters * block_per_s + 4 * hidden * head_rows * supervised_per_s
    generate = stages["generate"]
    train = stages["train"]
    return {
        "generate_tokens_per_s": generate["response_tokens"] / generate["seconds"],
        "generate_tokens": generate["response_tokens"], "generate_seconds": generate["seconds"],
        "train_steps": train["steps"], "train_steps_per_s": 1 / train["seconds_per_step"],
        "drafter_parameters": parameters, "block_size": block, "lm_head_rows": head_rows,
        "block_tokens_per_s": block_per_s, "train_tflops": flops_per_s / 1e12,
        "mfu": None if not peak_tflops else flops_per_s / (peak_tflops * 1e12),
        "stage_minutes": {name: round(stage["seconds"] / 60, 2) for name, stage in stages.items()},
    }


class _NoTokenizer:
    """A random-weight target has no tokenizer; costing needs none."""

    eos_token_id = pad_token_id = None

    def get_vocab(self) -> dict:
        return {}


def shaped_target_costs(*, dry_run: bool, repeats: int = 5, prompt_tokens: int = 512) -> dict:
    """measure_step_costs for a Llama-3.1-8B-shaped target with random weights (dry run: a tiny one on the CPU)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from trainer.drafter import Drafter, DrafterConfig
    from trainer.targets.loading import Target
    from trainer.validation.report import measure_step_costs

    device = torch.device("cpu" if dry_run else "cuda")
    dtype = torch.float32 if dry_run else torch.bfloat16
    shape = TINY_LLAMA_SHAPE if dry_run else LLAMA_8B_SHAPE
    config = LlamaConfig(**shape, tie_word_embeddings=False, attn_implementation="sdpa")
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            torch.manual_seed(0)
            model = LlamaForCausalLM(config).eval()
            target = Target(model, _NoTokenizer())
            target.__dict__["fingerprint"] = "random-llama-" + ("tiny" if dry_run else "8b-shape")
            drafter_config = DrafterConfig.for_target(target, variant="dflash2", num_layers=5, block_size=16,
                                                      mask_token_id=shape["vocab_size"] - 1)
            drafter = Drafter(drafter_config).eval()
    finally:
        torch.set_default_dtype(previous)
    prompt = torch.randint(0, shape["vocab_size"] - 1, (prompt_tokens if not dry_run else 32,),
                           generator=torch.Generator().manual_seed(0)).tolist()
    costs = measure_step_costs(target, drafter, prompt, repeats=repeats)
    return {"shape": shape, "dtype": str(dtype).removeprefix("torch."), "device": str(device),
            "prompt_tokens": len(prompt),
            "verify_ms": {b: s * 1000 for b, s in costs["verify"].items()},
            "draft_ms": {b: s * 1000 for b, s in costs["draft"].items()}}


def cost_rows(verify: dict, draft: dict) -> list[str]:
    one = float(verify[1] if 1 in verify else verify["1"])
    rows = ["   b   verify ms   x decode   draft ms"]
    for key in sorted(verify, key=int):
        b = int(key)
        drafted = draft.get(key, draft.get(b, draft.get(str(b))))
        rows.append(f"  {b:2d}  {float(verify[key]):10.2f}  {float(verify[key]) / one:9.2f}  "
                    + ("       -" if drafted is None else f"{float(drafted):9.2f}"))
    return rows


def print_job_table(figures: dict, report: dict, *, dry_run: bool, job_seconds: float | None) -> None:
    speed = report["speedup"]
    costs = report["step_costs_ms"]
    mfu = figures["mfu"]
    lines = [
        f"== GPU check{' (DRY RUN: CPU, tiny shapes; figures are not GPU figures)' if dry_run else ''} ==",
        f"device                    {report['device']['name']} ({report['device']['dtype']})",
        f"job wall clock            {'-' if job_seconds is None else f'{job_seconds / 60:.1f} min'}   stages (min): "
        + ", ".join(f"{name} {minutes}" for name, minutes in figures["stage_minutes"].items()),
        f"generation                {figures['generate_tokens_per_s']:,.0f} tokens/s "
        f"({figures['generate_tokens']:,} tokens in {figures['generate_seconds']:.0f} s, capture included)",
        f"training                  {figures['train_steps_per_s']:.2f} steps/s ({figures['train_steps']} steps), "
        f"{figures['block_tokens_per_s']:,.0f} block tokens/s",
        f"training MFU              {'n/a (no peak given)' if mfu is None else f'{100 * mfu:.2f} %'} "
        f"({figures['train_tflops']:.3f} TFLOP/s = 6 x {figures['drafter_parameters'] / 1e6:.1f}M drafter params x "
        f"block tokens/s + 4 x H x {figures['lm_head_rows']} head rows x supervised/s)",
        f"held-out tau              {report['tau']} at block {report['block_size']} ({report['prompts']} prompts; "
        f"per position {report['tau_per_position'][:6]}...)",
        f"batch-1 decoding          ours {speed['spec_tokens_per_s']} tok/s vs target alone "
        f"{speed['ar_tokens_per_s']} tok/s: {speed['ratio']}x, 95% CI {speed.get('ratio_ci95')} "
        f"(block {speed['block_size']}, {speed['prompts']} prompts)",
        f"greedy mismatches         {report['lossless']['greedy']['mismatches']}",
        "",
        f"draft/verify costs, SmolLM2-135M + trained drafter (report.json step_costs_ms, draft vocab "
        f"{costs.get('draft_vocab_size')}):",
        *cost_rows(costs["verify"], costs["draft"]),
    ]
    print("\n".join(lines), flush=True)


def print_shaped_costs(shaped: dict, *, dry_run: bool) -> None:
    print(f"draft/verify costs, {'tiny random Llama' if dry_run else 'Llama-3.1-8B shape, random weights'} "
          f"(hidden {shaped['shape']['hidden_size']}, {shaped['shape']['num_hidden_layers']} layers, vocab "
          f"{shaped['shape']['vocab_size']}, {shaped['dtype']} on {shaped['device']}, prompt {shaped['prompt_tokens']}), "
          "random 5-layer block-16 drafter, full vocabulary:", *cost_rows(shaped["verify_ms"], shaped["draft_ms"]),
          sep="\n", flush=True)


def kernel_step(*, dry_run: bool) -> dict:
    """The three Triton kernels against their torch references (bench/kernel_bench.py, no training step): timed on
    CUDA, checked in Triton's interpreter on a dry run. Skipped, saying so, where triton does not import. A
    failure is recorded, not raised: the job never needs the kernels (they are opt-in,
    DRAFTSMITH_TRITON_KERNELS=1), so the check goes on to its figures."""
    import importlib.util

    if importlib.util.find_spec("triton") is None:
        return {"skipped": "triton is not installed"}
    command = [sys.executable, str(Path(__file__).with_name("kernel_bench.py")), "--device",
               "cpu" if dry_run else "cuda", "--skip-step"]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        return {"failed": f"kernel_bench exited {done.returncode}: {(done.stdout + done.stderr)[-2000:]}"}
    return {"output": done.stdout[-4000:]}


class Findings:
    """What the check measured, in OUT/gpu_check.json, rewritten as each step finishes: a failure (or a call cut off
    at its time limit) leaves every finished step's figures there and printed, and a rerun into the same OUT keeps
    them and does only the steps still missing (the job resumes its finished stages)."""

    def __init__(self, path: Path):
        self.path = path
        self.data: dict = json.loads(path.read_text()) if path.is_file() else {}
        self.data.pop("failed", None)

    def step(self, name: str, measure) -> dict:
        if name in self.data:
            print(f"-- {name}: kept from an earlier run ({self.path})", flush=True)
            return self.data[name]
        print(f"-- {name} ...", flush=True)
        started = time.perf_counter()
        try:
            value = measure()
        except BaseException as error:  # KeyboardInterrupt and a killed subprocess too: say what finished
            self.data["failed"] = {"step": name, "error": f"{type(error).__name__}: {error}"[-3000:],
                                   "after_s": round(time.perf_counter() - started, 1)}
            self.write()
            finished = [key for key in self.data if key != "failed"]
            print(f"GPU check stopped at {name}: {self.data['failed']['error']}\nfinished: "
                  f"{', '.join(finished) or 'nothing'} (figures in {self.path}); rerun to resume", flush=True)
            raise
        self.data[name] = value
        self.write()
        return value

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        staging = self.path.with_suffix(".partial")
        staging.write_text(json.dumps(self.data, indent=1))
        staging.replace(self.path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the run's --out (OUT/.work holds what it wrote)")
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes: the same code paths")
    parser.add_argument("--skip-run", action="store_true", help="only read an earlier run in --out")
    parser.add_argument("--budget-minutes", type=float, default=5.0, help="the gpu preset's budget (default 5)")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help=f"the device's dense peak for MFU (default {H200_BF16_DENSE_TFLOPS:g} on a GPU, none on a CPU)")
    args = parser.parse_args(argv)
    peak = args.peak_tflops if args.peak_tflops is not None else (None if args.dry_run else H200_BF16_DENSE_TFLOPS)
    findings = Findings(args.out / "gpu_check.json")
    # Cheapest and most telling first: the 8B shape's costs need no data, the kernels no model. A failing step
    # raises after Findings has printed and saved what finished.
    shaped = findings.step("shaped_target_costs", lambda: shaped_target_costs(dry_run=args.dry_run))
    print_shaped_costs(shaped, dry_run=args.dry_run)
    kernels = findings.step("kernels", lambda: kernel_step(dry_run=args.dry_run))
    if "failed" in kernels:
        print(f"kernels: FAILED, the check goes on without them: {kernels['failed']}", flush=True)
    else:
        print(kernels.get("output") or f"kernels: skipped ({kernels.get('skipped')})", flush=True)
    job = findings.step("job", lambda: {"seconds": None} if args.skip_run else {"seconds": run_job(
        args.out, dry_run=args.dry_run, budget_minutes=args.budget_minutes)})
    work = args.out / ".work"
    figures = findings.step("figures", lambda: training_figures(work, peak))
    report = json.loads((work / "report.json").read_text())
    print_job_table(figures, report, dry_run=args.dry_run, job_seconds=job["seconds"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
