"""The model card (README.md) of an exported drafter: what it is for, how well it does, how to serve it."""

from __future__ import annotations

import json

from report.engine_figures import engine_markdown, headline_engine_rows
from report.warm_start import adapter_text, advice_text, before_after_rows, parent_text
from schemas.bounds import file_uri_path
from schemas.job_spec import BUNDLED_TABLE
from schemas.lineage import ServingSettings
from schemas.validation_report import (
    EngineRow,
    SamplingTest,
    Speedup,
    TargetDescription,
    TauAtTemperature,
    ValidationReport,
)
from trainer.drafter.config import DrafterConfig
from trainer.export.drafter_d2t import D2T_DIR
from trainer.export.record import serving_block
from trainer.targets.loading import Target

D2T_GGUF = "gguf/drafter-q8_0-d2t.gguf"
"""The GGUF whose own head covers the draft vocabulary, with llama.cpp's `d2t` (written by artifacts.py)."""


def _figures(report: ValidationReport | None) -> str:
    if report is None or not report.model_fields_set - {"version"}:
        return "No validation report was supplied to this export.\n"
    greedy, sampling, speed = report.greedy, report.sampling, report.speedup or Speedup()
    lines = [
        "| measure | value |", "|---|---|",
        f"| mean acceptance length tau (bonus token counted) | {report.tau} |",
        *_tau_rows(report),
        f"| oracle tau (gold token anywhere in the top-K) | {report.oracle_tau} |",
        f"| per-position conditional acceptance | {', '.join(str(a) for a in report.tau_per_position or [])} |",
        f"| lossless, greedy | {greedy.mismatches} mismatches over {greedy.prompts} prompts |",
        f"| lossless, sampling | {_sampling_line(sampling)} |",
        f"| decoding speed on the validation machine | {speed.ar_tokens_per_s} -> {speed.spec_tokens_per_s} "
        f"tokens/s ({speed.ratio}x{_interval(speed.ratio_ci95)}, {speed.decoding}) |",
        f"| recommended block size | {report.recommended_block_size} |",
    ]
    lines += _device_rows(report)
    advice = report.serving_advice
    if advice:
        lines = [f"**{'Recommendation' if advice.enable is not False else 'Not recommended here'}:** "
                 f"{advice.summary}.", ""] + lines
    costs = report.step_costs_ms
    if costs:
        lines += ["", "Measured step costs (ms) per block size b, batch 1 on the validation machine: drafting "
                  "b - 1 tokens and verifying b tokens (b = 1: one plain decode step).", "",
                  "| b | draft | verify |", "|---|---|---|"]
        lines += [f"| {b} | {(costs.draft or {}).get(b, '')} | {v} |" for b, v in (costs.verify or {}).items()]
    categories = report.acceptance_by_category or {}
    if categories:
        lines += ["", "Acceptance by prompt category:", "", "| category | tau | cycles |", "|---|---|---|"]
        lines += [f"| {name} | {v.tau} | {v.cycles} |" for name, v in categories.items()]
    return "\n".join(lines) + "\n"


def _warm_start(report: ValidationReport | None) -> str:
    """The card's warm-start section: the parent's origin and format, which drafter to serve, and the parent
    against this drafter on the same held-out prompts in the serving mode (report.json `warm_start`)."""
    if report is None or report.warm_start is None:
        return ""
    warm_start = report.warm_start
    lines = ["## Warm start: the parent against this drafter", ""]
    parent = parent_text(warm_start)
    if parent:
        lines += [f"Started from the parent drafter {parent}.", ""]
    adapter = adapter_text(warm_start)
    if adapter:
        lines += [adapter, ""]
    advice = advice_text(warm_start)
    if advice:
        lines += [f"**{'Keep serving the parent' if warm_start.keep_parent else 'Serve this drafter'}:** {advice}", ""]
    rows = before_after_rows(warm_start) or [("the job's parameters", str(warm_start.parent_tau), str(warm_start.tau),
                                              "–")]
    mode = warm_start.serving_mode or report.serving_mode
    where = f", in the serving mode ({mode.summary()})" if mode is not None else ""
    lines += [f"Both measured on the same {warm_start.prompts} held-out prompts of this target{where}; tau with its "
              "95 % interval, the ratio with its paired bootstrap interval.", "",
              "| sampling | parent tau | this drafter tau | ratio new / parent |", "|---|---|---|---|"]
    lines += [f"| {setting} | {parent_tau} | {tau} | {ratio} |" for setting, parent_tau, tau, ratio in rows]
    return "\n".join(lines) + "\n\n"


def _serving_mode_line(report: ValidationReport | None) -> str:
    mode = report.serving_mode if report else None
    return f"\nIts data was regenerated, and every tau below measured, in this mode: {mode.summary()}.\n" if mode else ""


def _tau_rows(report: ValidationReport) -> list[str]:
    """tau at T=0 and at the job's own sampling parameters, each with its interval (report.json `tau_greedy`,
    `tau_sampled`); reports written before both were measured have neither row."""
    rows = []
    greedy, sampled = report.tau_greedy, report.tau_sampled
    if greedy and greedy.tau is not None:
        rows.append(f"| tau at T=0 (greedy, replayed) | {_tau_value(greedy)} |")
    if sampled and sampled.tau is not None:
        if sampled.same_as_greedy:
            rows.append(f"| tau at the job's temperature (T={sampled.temperature}) | {sampled.tau}: the job is greedy, "
                        "so this is the T=0 figure |")
        else:
            rows.append(f"| tau at the job's temperature (T={sampled.temperature}, top-p {sampled.top_p}, top-k "
                        f"{sampled.top_k}; speculative sampling, measured) | {_tau_value(sampled)} |")
    return rows


def _tau_value(figure: TauAtTemperature) -> str:
    ci = figure.ci95 or []
    interval = f" (95 % interval {ci[0]}-{ci[1]})" if len(ci) == 2 else ""
    return f"{figure.tau}{interval}, {figure.prompts} prompts, {figure.tokens} tokens"


def _device_rows(report: ValidationReport) -> list[str]:
    """Where it was validated (trainer/device.py's plan) and what the greedy check compared (report.py's gate);
    reports written before either was recorded have neither row."""
    rows = []
    device = report.device
    if device:
        many = f", {device.count} devices" if (1 if device.count is None else device.count) > 1 else ""
        rows.append(f"| validated on | {device.name} (`{device.device}`{many}), {device.dtype} |")
    gate = report.greedy_gate
    if gate:
        rows.append(f"| greedy check reference ({gate.dtype}, {gate.prompts} prompts) | {gate.reference} |")
    return rows


def _interval(ci) -> str:
    return f", 95 % interval {ci[0]}-{ci[1]}x" if ci else ""


def _sampling_line(sampling: SamplingTest) -> str:
    if sampling.status == "inconclusive":
        return f"not tested: {sampling.reason}"
    if sampling.p_value is None:  # a report that predates the p-value: its verdict is all it says
        return sampling.verdict() or "not recorded"
    return f"p = {sampling.p_value:.3g} ({sampling.draws} draws; {sampling.test})"


def _best_llama_cpp(report: ValidationReport | None) -> EngineRow | None:
    """The fastest drafter row the engine step measured in llama.cpp (its command is the card's), else None."""
    rows = [r for r in headline_engine_rows(report.engines if report else None) if r.engine == "llama.cpp"
            and r.spec == "draft-dflash" and r.tokens_per_s]
    return max(rows, key=lambda r: r.tokens_per_s, default=None)


def _llama_command(report: ValidationReport | None, llama_gguf: str, flags: ServingSettings) -> str:
    """The llama.cpp command the engine step measured fastest (with the target's GGUF as `target.gguf`), else the
    plain one for the recommended block."""
    best = _best_llama_cpp(report)
    if best:
        return best.command.replace("target-f16.gguf", "target.gguf").replace("target-q4_1.gguf", "target.gguf")
    return f"llama-server -m target.gguf -md ./{llama_gguf} {flags.llama_cpp}"


def _objective_line(report: ValidationReport | None) -> str:
    """The card's line on what training optimised (report.json `training_objective`), or nothing for an older report."""
    objective = report.training_objective if report else None
    if objective is None or not objective.summary:
        return ""
    return f"- trained with: {objective.summary}\n"


def _family_line(names: TargetDescription) -> str:
    """The card's line on the target's family (trainer/targets/families.py)."""
    kinds = ", ".join(f"{count} {kind}" for kind, count in (names.layer_kinds or {}).items())
    note = f" ({names.engines_note})" if names.engines_note else ""
    return (f"- target family: {names.family} ({kinds} attention layers{', routed experts' if names.moe else ''}); "
            f"engines that serve a DFlash drafter for it: {', '.join(names.engines or [])}{note}")


def _adapter_line(names: TargetDescription) -> str:
    """For a target handed over as a LoRA adapter: which adapter over which base (what serving must merge)."""
    if not names.adapter:
        return ""
    return (f"- target: the LoRA adapter `{names.name}` over the base model `{names.base}`, merged into it "
            "(peft's `merge_and_unload`); serve the merged model, or the base with this adapter merged the same way\n")


def _not_served(engine: str, names: TargetDescription) -> str:
    return (f"{engine} does not serve a DFlash drafter for {names.family} targets today "
            f"(trainer/targets/families.py); use "
            f"{', '.join(names.engines or []) or 'the Draftsmith decoder (draftsmith decode)'}.\n")


def model_card(config: DrafterConfig, target: Target, report: ValidationReport | None, names: TargetDescription,
               *, no_gguf: str | None = None) -> str:
    """README.md. `names`: the target as the job named it and its family (`Target.describe`); `no_gguf`: why no GGUF
    was written (export's write_engine_drafters), else None."""
    block = config.block_size
    recommended = serving_block(config, report)
    sampling = json.dumps(report.sampling_parameters if report and report.sampling_parameters is not None else {},
                          indent=2)
    engines = report.engines if report else None
    variant = {"dflash2": "DFlash 2 (dynamic convolutions + candidate selector)", "dflash": "DFlash"}[config.variant]
    # With a draft vocabulary, llama.cpp drafts over it (its own head + `d2t`); the full-head files stay for the rest.
    llama_gguf = D2T_GGUF if config.draft_vocab_size else "gguf/drafter-q8_0.gguf"
    vocab_files = (f", `{D2T_DIR}/` (the drafter with its draft vocabulary of the {config.draft_vocab_size:,} most "
                   f"frequent tokens as vLLM reads one: top-level `draft_vocab_size`, `d2t` and the head's rows as "
                   f"`lm_head.weight`)" + ("" if no_gguf else f" and `{D2T_GGUF}` (the same for llama.cpp: its own "
                                                               "head + `d2t`)")
                   if config.draft_vocab_size else "")
    # vLLM reads a draft vocabulary only for DFlash (v1); its DFlash 2 candidate head ignores `d2t`.
    vllm_folder = D2T_DIR if config.draft_vocab_size and config.variant == "dflash" else "drafter"
    gguf_files = f"no GGUF ({no_gguf})" if no_gguf else "`gguf/drafter-f16.gguf`, `gguf/drafter-q8_0.gguf`"
    adapter_line = _adapter_line(names)
    serving = _serving(config, report, names, no_gguf, recommended, llama_gguf, vllm_folder)
    return f"""---
library_name: transformers
tags: [speculative-decoding, dflash, draftsmith]
---
# {variant} drafter for `{names.name}`

A block-diffusion speculative-decoding drafter trained by Draftsmith for this exact target and these
sampling parameters. It drafts {block - 1} tokens per cycle from the target's own hidden states (layers
{list(config.target_layer_ids)}) and borrows the target's embedding and LM head. Verification makes the
output identical to the target's alone (greedy) and distributed exactly like it (sampling).

{adapter_line}- target fingerprint (tokenizer + embedding{" + adapter" if adapter_line else ""}): `{target.fingerprint}`
- drafter: {config.num_layers} layers, hidden size {config.hidden_size}, block size {block}, mask token id
  {config.mask_token_id}
{_family_line(names)}
{_objective_line(report)}- files: `drafter/` (reference `dflash` format, safetensors, full head), {gguf_files}{vocab_files}

## Sampling parameters it was trained and validated for

```json
{sampling}
```
{_serving_mode_line(report)}
## Validation

{_figures(report)}
{_warm_start(report)}## Measured in serving engines

{engine_markdown(engines)}
## Serving

{serving}"""


def serving_model(name: str) -> str:
    """What an engine's --model takes for the target a job named: a Hub repo id (a bundled target's source repo), a
    local folder, or TARGET where the job read it from somewhere an engine cannot load (s3://)."""
    if name.startswith("hf://"):
        return name.removeprefix("hf://").split("@", 1)[0]
    if name.startswith("file://"):
        return file_uri_path(name)
    bundled = BUNDLED_TABLE.get(name.removeprefix("bundled:"))
    if bundled is not None:
        return bundled.hub_id
    return "TARGET" if "://" in name else name


def _serving(config: DrafterConfig, report: ValidationReport | None, names: TargetDescription, no_gguf: str | None,
             recommended: int, llama_gguf: str, vllm_folder: str) -> str:
    """The card's serving section: a command for each engine that serves this family's drafters, a line for each
    that does not."""
    served, model = set(names.engines or []), names.base if names.adapter else names.name
    flags = ServingSettings.at_block(recommended)  # the flags drafter-record.json stores (trainer/export/record.py)
    vllm = dict(flags.vllm or {})
    speculative = json.dumps({"method": vllm.pop("method"), "model": f"./{vllm_folder}", **vllm})
    parts = [f"""Which engine loads which file: SGLang, transformers (the `dflash` package) and Draftsmith load `drafter/`;
vLLM loads `./{vllm_folder}`; llama.cpp loads `{llama_gguf}`{"" if no_gguf else " (full-head GGUFs: `gguf/drafter-{f16,q8_0}.gguf`)"}.
Each engine counts the block differently: SGLang takes the whole block (anchor + drafts), vLLM and
llama.cpp the number of drafted tokens (block size - 1). Block size {recommended} is recommended from the
measured acceptance; any size up to {config.block_size} works.
"""]
    if names.adapter:
        parts[0] += ("The target is the base with the adapter merged (peft's `merge_and_unload`): serve that merged "
                     "model where a command says MERGED_TARGET.\n")
    target_arg = "MERGED_TARGET" if names.adapter else serving_model(model)
    if "SGLang" in served:
        parts.append(f"""SGLang:
```bash
python -m sglang.launch_server --model-path {target_arg} \\
    --speculative-draft-model-path ./drafter \\
    {flags.sglang}
```
""")
    else:
        parts.append(f"SGLang: {_not_served('SGLang', names)}")
    if "vLLM" in served:
        vllm_note = ("vLLM serves DFlash 2 only with its V2 model runner, which needs Triton (a GPU): on a CPU its V1 "
                     "runner refuses the drafter (\"Model Runner V1 does not support: DFlash candidate-head drafts\"). "
                     "Train with `drafter.variant: dflash` (`draftsmith run --variant dflash`) for vLLM on a CPU."
                     if config.variant == "dflash2" else
                     "This DFlash (v1) drafter loads in vLLM's CPU build as well (its V1 model runner).")
        measured = next((r for r in headline_engine_rows(report.engines if report else None)
                         if r.engine == "vllm" and r.spec == "dflash" and r.command), None)
        vllm_command = (measured.command if measured else
                        f"LLM(model=TARGET, speculative_config={speculative}).generate(prompt_token_ids, ...)")
        parts.append(f"""vLLM: {vllm_note} The engine step runs it offline, as
`{vllm_command}`; the server takes the same configuration:
```bash
vllm serve {target_arg} --speculative-config '{speculative}'
```
""")
    else:
        parts.append(f"vLLM: {_not_served('vLLM', names)}")
    if "llama.cpp" in served and not no_gguf:
        parts.append(f"""llama.cpp (the command the engine step measured fastest, when it ran; `target.gguf` is the target's GGUF):
```bash
{_llama_command(report, llama_gguf, flags)}
```
""")
    else:
        parts.append("llama.cpp: " + (f"no GGUF was written ({no_gguf}).\n" if no_gguf and "llama.cpp" in served
                                      else _not_served("llama.cpp", names)))
    parts.append(f"""Transformers, with the reference package (`pip install dflash==0.1.0`){"" if "transformers" in served else " (not measured on this family)"}:
```python
from dflash.model import {'DFlash2DraftModel' if config.variant == 'dflash2' else 'DFlashDraftModel'} as Drafter, dflash_generate
drafter = Drafter.from_pretrained("./drafter").eval()
output_ids = dflash_generate(drafter, target_model, input_ids, max_new_tokens=256, stop_token_ids=[...])
```
""")
    if names.rollback == "replay":
        parts.append("This target carries recurrent (linear-attention) state: an engine must restore it after a "
                     "rejected draft, which `draftsmith decode` does exactly (restore + replay of the accepted "
                     "tokens); a plain cache crop is not lossless on it.\n")
    return "\n".join(parts)
