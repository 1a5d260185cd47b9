"""Runs NeMo Automodel 0.7.0's DFlash / DFlash 2 recipe on a CPU, in-process, with the few run-time overrides it
needs there. Executed with the peer venv's python (bench/peers/nemo_automodel_peer.py builds the command); never
imported by the project. NeMo's installed sources are not changed: every override below replaces a function or
a table entry in memory before NeMo's own entry point runs.

    python bench/peers/nemo_automodel_launch.py train RUN.yaml --variant dflash|dflash2 --max-steps N [--warmup-steps W]
    python bench/peers/nemo_automodel_launch.py tokenize TARGET_DIR ROWS.jsonl OUT.json
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys

# This file's folder (bench/peers/) is sys.path[0]; drop it so none of the bench's own modules can shadow a package
# NeMo imports.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)


def tokenize(target_dir: str, rows_path: str, out_path: str) -> None:
    """NeMo's own tokenization of our rows (its tokenizer wrapper and ChatDataset, with the settings the train
    config uses, unpadded): what its trainer will see, so the caller keeps only the rows equal to our data."""
    from nemo_automodel._transformers.auto_tokenizer import NeMoAutoTokenizer
    from nemo_automodel.components.datasets.llm.chat_dataset import ChatDataset

    tokenizer = NeMoAutoTokenizer.from_pretrained(target_dir)
    dataset = ChatDataset(rows_path, tokenizer=tokenizer, padding="do_not_pad", truncation=True, unshifted=True,
                          mask_generation_prompt=True, mask_history=True)
    out = [{"input_ids": list(map(int, s["input_ids"])), "loss_mask": list(map(int, s["loss_mask"]))}
           for s in (dataset[i] for i in range(len(dataset)))]
    with open(out_path, "w") as handle:
        json.dump(out, handle)


def train(config: str, variant: str, max_steps: int, warmup_steps: int | None) -> None:
    import torch

    # Override 1: NeMoAutoModelForCausalLM.from_pretrained calls torch.cuda.current_device() unconditionally,
    # twice: once as the index of a torch.device("cuda", i) handed to the pipeline-parallel set-up (unused
    # without pipeline parallelism), once as the device the target's weights are materialised on. A CPU build
    # of torch raises on the call itself; 0 satisfies the first use, override 2 replaces the second.
    torch.cuda.current_device = lambda: 0
    from nemo_automodel._transformers import auto_model

    # Override 2: materialise and load the frozen target on the CPU (the device from override 1 would be cuda:0).
    apply_infrastructure = auto_model.apply_model_infrastructure
    auto_model.apply_model_infrastructure = lambda **kw: apply_infrastructure(**{**kw, "device": torch.device("cpu")})

    # Override 3: NeMo's DFlash registry lists Qwen3 / Qwen3.5 / Kimi K3 targets only. SmolLM2 is a Llama, whose
    # decoder has the shape the Qwen3 draft (and its config derivation from the target's) expects; map it to
    # the Qwen3 entry (the same draft classes, DFlash and DFlash 2).
    from nemo_automodel.components.speculative.dflash import registry

    qwen3 = registry.DFLASH_DRAFT_REGISTRY["Qwen3ForCausalLM"]
    for name in ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"):
        registry.DFLASH_DRAFT_REGISTRY.setdefault(name, qwen3)

    # Override 4: the DFlash recipes build their chat data without ChatDataset's own `mask_history` switch, so
    # a multi-turn prompt's earlier assistant turns (prompt text, not the target's output) would be supervised.
    # Turned on, only the last assistant turn (our regenerated response) is, as in our data.
    from nemo_automodel.components.datasets.llm import chat_dataset, eagle3

    eagle3.ChatDataset = functools.partial(chat_dataset.ChatDataset, mask_history=True)

    from nemo_automodel.components.config._arg_parser import parse_args_and_load_config
    from nemo_automodel.recipes.llm import train_dflash

    if variant == "dflash2":
        from nemo_automodel.recipes.llm.train_dflash2 import TrainDFlash2Recipe as Recipe
    else:
        Recipe = train_dflash.TrainDFlashRecipe

    # Override 5: NeMo runs whole epochs (no max_steps). The bench compares trainers at a given number of
    # optimizer steps, so the schedule's horizon becomes max_steps (NeMo's own warm-up + cosine function and
    # warm-up rule, int(warmup_ratio x steps), unless --warmup-steps fixes it) and, below, the data loader stops
    # once max_steps optimizer steps are done. The config asks for enough epochs to get there.
    optimizer_cfg = parse_args_and_load_config(config, argv=["--config", config]).optimizer
    warmup = warmup_steps if warmup_steps is not None else max(
        1, int(float(optimizer_cfg.get("warmup_ratio", 0.05)) * max_steps))
    nemo_schedule = train_dflash.make_warmup_cosine_schedule
    train_dflash.make_warmup_cosine_schedule = lambda _w, _t, min_lr_ratio: nemo_schedule(
        warmup, max_steps, min_lr_ratio)

    # The recipe's own main(), in three calls, with the run length set between setup and the loop.
    recipe = Recipe(parse_args_and_load_config(config, argv=["--config", config]))
    recipe.setup()
    recipe.total_optim_steps = max_steps
    loader = recipe.train_dataloader
    recipe.untrack_state("train_dataloader")
    recipe.train_dataloader = _StopAfter(loader, recipe, max_steps)
    print(f"nemo_automodel_launch: max_steps={max_steps} warmup_steps={warmup} "
          f"batches_per_epoch={len(recipe.train_dataloader)} epochs={recipe.num_epochs}", flush=True)
    recipe.run_train_validation_loop()


class _StopAfter:
    """The recipe's data loader, ending every epoch once the recipe has made `steps` optimizer steps."""

    def __init__(self, loader, recipe, steps: int):
        self.loader, self.recipe, self.steps = loader, recipe, steps

    def __len__(self):
        return len(self.loader)

    def __getattr__(self, name):  # sampler, dataset, ... as the loader has them
        return getattr(self.loader, name)

    def __iter__(self):
        for batch in self.loader:
            if self.recipe.runtime.global_step >= self.steps:
                return
            yield batch


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("train")
    run.add_argument("config")
    run.add_argument("--variant", choices=("dflash", "dflash2"), required=True)
    run.add_argument("--max-steps", type=int, required=True)
    run.add_argument("--warmup-steps", type=int)
    tok = sub.add_parser("tokenize")
    tok.add_argument("target_dir")
    tok.add_argument("rows")
    tok.add_argument("out")
    args = parser.parse_args()
    if args.command == "train":
        train(args.config, args.variant, args.max_steps, args.warmup_steps)
    else:
        tokenize(args.target_dir, args.rows, args.out)


if __name__ == "__main__":
    main()
