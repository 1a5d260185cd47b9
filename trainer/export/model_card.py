"""The model card (README.md) of an exported drafter: what it is for, how well it does, how to serve it."""

from __future__ import annotations

import json

from report.engine_figures import engine_markdown, headline_engine_rows
from schemas.validation_report import EngineRow, SamplingTest, Speedup, ValidationReport
from trainer.drafter.config import DrafterConfig
from trainer.export.drafter_d2t import D2T_DIR
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
    return f"p = {sampling.p_value:.3g} ({sampling.draws} draws; {sampling.test})"


def _best_llama_cpp(report: ValidationReport | None) -> EngineRow | None:
    """The fastest drafter row the engine step measured in llama.cpp (its command is the card's), else None."""
    rows = [r for r in headline_engine_rows(report.engines if report else None) if r.engine == "llama.cpp"
            and r.spec == "draft-dflash" and r.tokens_per_s]
    return max(rows, key=lambda r: r.tokens_per_s, default=None)


def _llama_command(report: ValidationReport | None, llama_gguf: str, recommended: int) -> str:
    """The llama.cpp command the engine step measured fastest (with the target's GGUF as `target.gguf`), else the
    plain one for the recommended block."""
    best = _best_llama_cpp(report)
    if best:
        return best.command.replace("target-f16.gguf", "target.gguf").replace("target-q4_1.gguf", "target.gguf")
    return f"llama-server -m target.gguf -md ./{llama_gguf} --spec-type draft-dflash --spec-draft-n-max {recommended - 1}"


def _family_lines(target: Target) -> tuple[str, str]:
    """The card's line on the target's family (trainer/targets/families.py), and which GGUFs it has."""
    family = target.family
    kinds = ", ".join(f"{count} {kind}" for kind, count in family["layer_kinds"].items())
    line = (f"- target family: {family['family']} ({kinds} attention layers{', routed experts' if family['moe'] else ''}"
            f"); engines that serve a DFlash drafter for it: {family['engines']}")
    ggufs = ("`gguf/drafter-f16.gguf`, `gguf/drafter-q8_0.gguf`" if family["gguf"] else
             "no GGUF (this family's vocabulary is SentencePiece: convert `drafter/` with llama.cpp's "
             "convert_hf_to_gguf.py)")
    return line, ggufs


def _adapter_line(target: Target) -> str:
    """For a target handed over as a LoRA adapter: which adapter over which base (what serving must merge)."""
    if getattr(target, "adapter_path", None) is None:
        return ""
    return (f"- target: the LoRA adapter `{target.adapter_path}` over the base model `{target.path}`, merged into it "
            "(peft's `merge_and_unload`); serve the merged model, or the base with this adapter merged the same way\n")


def model_card(config: DrafterConfig, target: Target, report: ValidationReport | None, target_name: str) -> str:
    block = config.block_size
    recommended = report.recommended_block_size if report and report.recommended_block_size is not None else block
    sampling = json.dumps(report.sampling_parameters if report and report.sampling_parameters is not None else {},
                          indent=2)
    engines = report.engines if report else None
    variant = {"dflash2": "DFlash 2 (dynamic convolutions + candidate selector)", "dflash": "DFlash"}[config.variant]
    # With a draft vocabulary, llama.cpp drafts over it (its own head + `d2t`); the full-head files stay for the rest.
    llama_gguf = D2T_GGUF if config.draft_vocab_size else "gguf/drafter-q8_0.gguf"
    vocab_files = (f", `{D2T_DIR}/` (the drafter with its draft vocabulary of the {config.draft_vocab_size:,} most "
                   f"frequent tokens as vLLM reads one: top-level `draft_vocab_size`, `d2t` and the head's rows as "
                   f"`lm_head.weight`) and `{D2T_GGUF}` (the same for llama.cpp: its own head + `d2t`)"
                   if config.draft_vocab_size else "")
    # vLLM reads a draft vocabulary only for DFlash (v1); its DFlash 2 candidate head ignores `d2t`.
    vllm_folder = D2T_DIR if config.draft_vocab_size and config.variant == "dflash" else "drafter"
    speculative = json.dumps({"method": "dflash", "model": f"./{vllm_folder}", "num_speculative_tokens": recommended - 1})
    vllm_note = ("vLLM serves DFlash 2 only with its V2 model runner, which needs Triton (a GPU): on a CPU its V1 "
                 "runner refuses the drafter (\"Model Runner V1 does not support: DFlash candidate-head drafts\"). "
                 "Train with `drafter.variant: dflash` (`draftsmith run --variant dflash`) for vLLM on a CPU.\n"
                 if config.variant == "dflash2" else
                 "This DFlash (v1) drafter loads in vLLM's CPU build as well (its V1 model runner).\n")
    measured = next((r for r in headline_engine_rows(engines) if r.engine == "vllm" and r.spec == "dflash"
                     and r.command), None)
    vllm_command = (measured.command if measured else
                    f"LLM(model=TARGET, speculative_config={speculative}).generate(prompt_token_ids, ...)")
    family_line, gguf_files = _family_lines(target)
    adapter_line = _adapter_line(target)
    llama_command = _llama_command(report, llama_gguf, recommended)
    return f"""---
library_name: transformers
tags: [speculative-decoding, dflash, draftsmith]
---
# {variant} drafter for `{target_name}`

A block-diffusion speculative-decoding drafter trained by Draftsmith for this exact target and these
sampling parameters. It drafts {block - 1} tokens per cycle from the target's own hidden states (layers
{list(config.target_layer_ids)}) and borrows the target's embedding and LM head. Verification makes the
output identical to the target's alone (greedy) and distributed exactly like it (sampling).

{adapter_line}- target fingerprint (tokenizer + embedding{" + adapter" if adapter_line else ""}): `{target.fingerprint}`
- drafter: {config.num_layers} layers, hidden size {config.hidden_size}, block size {block}, mask token id
  {config.mask_token_id}
{family_line}
- files: `drafter/` (reference `dflash` format, safetensors, full head), {gguf_files}{vocab_files}

## Sampling parameters it was trained and validated for

```json
{sampling}
```

## Validation

{_figures(report)}
## Measured in serving engines

{engine_markdown(engines)}
## Serving

Which engine loads which file: SGLang, transformers (the `dflash` package) and Draftsmith load `drafter/`;
vLLM loads `./{vllm_folder}`; llama.cpp loads `{llama_gguf}` (full-head GGUFs: `gguf/drafter-{{f16,q8_0}}.gguf`).
Each engine counts the block differently: SGLang takes the whole block (anchor + drafts), vLLM and
llama.cpp the number of drafted tokens (block size - 1). Block size {recommended} is recommended from the
measured acceptance; any size up to {block} works.

SGLang:
```bash
python -m sglang.launch_server --model-path {target_name} \\
    --speculative-algorithm DFLASH --speculative-draft-model-path ./drafter \\
    --speculative-num-draft-tokens {recommended}
```

vLLM: {vllm_note.strip()} The engine step runs it offline, as
`{vllm_command}`; the server takes the same configuration:
```bash
vllm serve {target_name} --speculative-config '{speculative}'
```

llama.cpp (the command the engine step measured fastest, when it ran; `target.gguf` is the target's GGUF):
```bash
{llama_command}
```

Transformers, with the reference package (`pip install dflash==0.1.0`):
```python
from dflash.model import {'DFlash2DraftModel' if config.variant == 'dflash2' else 'DFlashDraftModel'} as Drafter, dflash_generate
drafter = Drafter.from_pretrained("./drafter").eval()
output_ids = dflash_generate(drafter, target_model, input_ids, max_new_tokens=256, stop_token_ids=[...])
```
"""
