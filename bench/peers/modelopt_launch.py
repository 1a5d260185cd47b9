"""Run NVIDIA ModelOpt's DFlash training as its `examples/speculative_decoding/main.py` does (that script is not in
the wheel), offline, on a CPU. Executed by bench/peers/modelopt_peer.py with the ModelOpt venv's python:

    .engines/modelopt/bin/python bench/peers/modelopt_launch.py ROW_DIR/modelopt_run.json

The JSON names the packaged recipe and the row's dotlist overrides (bench/peers/modelopt_peer.py `settings_for`), the
export folder and a metrics file. Everything here is ModelOpt's or transformers' own code path; what this CPU
needs is set through the recipe (use_cpu, tf32 false, report_to none), and the one failure tolerated is the
pickling error of the final `save_model`, after checking that its weights were written.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import sys
import time
from pathlib import Path

import torch


def main(config_path: str) -> None:
    run = json.loads(Path(config_path).read_text())
    threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
    torch.set_num_threads(threads)  # the measured process stays at the row's thread count
    torch.set_num_interop_threads(threads)

    import modelopt.torch.opt as mto
    import modelopt.torch.speculative as mtsp
    import transformers
    from modelopt.recipe import load_recipe
    from modelopt.torch.export import export_speculative_decoding
    from modelopt.torch.speculative.eagle.utils import EagleOfflineDataCollator, OfflineSupervisedDataset
    from modelopt.torch.speculative.plugins.hf_training_args import TrainingArguments as SpecTrainingArgs
    from modelopt.torch.speculative.utils import load_vlm_or_llm

    # As main.py: seed, ModelOpt state in HF checkpoints, and its HF-compatible TrainingArguments.
    torch.manual_seed(0)
    mto.enable_huggingface_checkpointing()
    hf_training_arguments = dataclasses.make_dataclass(
        "HfTrainingArguments",
        [(name, field.annotation, dataclasses.field(default=field.default))
         for name, field in SpecTrainingArgs.model_fields.items()],
        bases=(transformers.TrainingArguments,))

    recipe = load_recipe(run["recipe"], overrides=run["overrides"])
    args = hf_training_arguments(**recipe.training.model_dump())
    assert recipe.data.mode == "offline" and recipe.dflash.dflash_offline
    print("recipe:", json.dumps({"training": recipe.training.model_dump(), "dflash": recipe.dflash.model_dump()},
                                default=str), flush=True)

    model = load_vlm_or_llm(recipe.model.model_name_or_path, use_fake_base=recipe.model.use_fake_base_for_offline,
                            use_offline_training=True, dtype="auto", device_map="cpu")
    mtsp.convert(model, [("dflash", recipe.dflash.model_dump())])
    print("draft config:", model.dflash_config.to_json_string(use_diff=False), flush=True)
    print("trainable parameters:", sum(p.numel() for p in model.parameters() if p.requires_grad), flush=True)

    # main.py's offline data module (eagle_utils.make_speculative_data_module), from the wheel's own classes.
    files = sorted(str(p) for p in Path(recipe.data.offline_data_path).rglob("*.pt"))
    dataset = OfflineSupervisedDataset(files, answer_only_loss=args.answer_only_loss)
    collator = EagleOfflineDataCollator(train_len=args.training_seq_len)
    metrics = Path(run["metrics"])
    metrics.write_text("")

    class Trainer(transformers.Trainer):
        """main.py's EagleTrainerWithAccLog in what matters here: the model's own loss, unscaled."""

        def compute_loss(self, *a, **kw):
            kw.pop("num_items_in_batch", None)
            loss, outputs = super().compute_loss(*a, return_outputs=True, **kw)
            self.last_acc = float(outputs.train_acc[0][0]) if getattr(outputs, "train_acc", None) else None
            return loss

    class Log(transformers.TrainerCallback):
        def on_log(self, args_, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                entry = {"step": state.global_step, **logs, "train_acc": getattr(trainer, "last_acc", None),
                         "time": time.time(), "cpu_s": time.process_time()}
                with metrics.open("a") as out:
                    out.write(json.dumps(entry) + "\n")

    trainer = Trainer(model=model, args=args, train_dataset=dataset, data_collator=collator, callbacks=[Log()])
    trainer.can_return_loss = True
    started = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - started
    trainer.save_state()
    final_save = "ok"
    try:
        trainer.save_model(args.output_dir)
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        # Known in ModelOpt 0.47 / main.py: the weights are written, then torch.save(args) fails because
        # HfTrainingArguments is made by make_dataclass at run time (pickle cannot find the class). Tolerated.
        if "pickle" not in str(exc).lower() or not list(Path(args.output_dir).glob("*.safetensors")):
            raise
        final_save = f"weights written, then {type(exc).__name__}: {str(exc)[:200]}"
    print("final save:", final_save, flush=True)

    # scripts/export_hf_checkpoint.py: the draft module in the deployment (z-lab `dflash`) format.
    model.eval()
    with torch.inference_mode():
        export_speculative_decoding(model, export_dir=run["export_dir"])
    with metrics.open("a") as out:
        out.write(json.dumps({"event": "done", "global_step": trainer.state.global_step, "train_s": train_s,
                              "final_save": final_save}) + "\n")
    print("exported to", run["export_dir"], flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
