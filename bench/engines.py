"""The drafter in the serving engines installed here (llama.cpp, vLLM CPU), beside each engine's n-gram drafter.

    python -m bench.engines --target smollm2-135m --drafter OUT            # an export folder, run as exported
    python -m bench.engines --target DIR --drafter RUN/drafter --engines llama.cpp --prompts 8 --max-new-tokens 96

The same measurement as validation's engine step (trainer/validation/engines.py) on held-out built-in prompts
(or a prompts file), printing a table: τ as each engine counts it, tokens/s and the ratio to that engine's
target alone, and whether the greedy output equals the engine's own target-alone output and our float32
target's, token for token. `--drafter` takes an export (its drafter/, drafter-d2t/ and GGUFs are used as they
are) or a trained drafter directory (exported into --work first). `--full` prints every row of the grid.
Engines come from bench/setup/llama_cpp.sh and bench/setup/vllm_cpu.sh; an absent one is skipped. Writes the
section as JSON to --json when given. Run it under `nice` on a shared machine; the machine load is printed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2-135m", help="target directory or bundled name")
    parser.add_argument("--drafter", required=True, type=Path, help="an export folder or a drafter directory")
    parser.add_argument("--work", type=Path, default=None, help="keep logs, GGUFs and results here")
    parser.add_argument("--engines", default="llama.cpp,vllm")
    parser.add_argument("--prompts", type=int, default=None, help="held-out prompts (default: validation's 4)")
    parser.add_argument("--prompts-file", default="builtin")
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--num-speculative-tokens", type=int, default=None, help="vLLM's k (default: recommended)")
    parser.add_argument("--full", action="store_true", help="print every row of the grid")
    parser.add_argument("--budget", type=float, default=None, help="seconds for the whole step (default: validation's)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    import tempfile

    from report.engine_figures import engine_markdown
    from trainer.export.drafter_d2t import REFERENCE_DIR
    from trainer.pipeline import Layout, RunConfig, open_job
    from trainer.validation.engines import ENGINE_MAX_NEW_TOKENS, ENGINE_PROMPTS, engine_step

    config = RunConfig(target=args.target, prompts=args.prompts_file)
    work = args.work or Path(tempfile.mkdtemp(prefix="engines-bench-"))
    job = open_job(config, Layout.under(work / "job", work / "out"))
    _, holdout = job.prompts()
    export = args.drafter if (args.drafter / REFERENCE_DIR / "config.json").is_file() else None
    section = engine_step(job.target, export / REFERENCE_DIR if export else args.drafter, holdout, config.sampling,
                          work_dir=work, engines=tuple(e for e in args.engines.split(",") if e),
                          num_prompts=args.prompts or ENGINE_PROMPTS,
                          max_new_tokens=args.max_new_tokens or ENGINE_MAX_NEW_TOKENS,
                          num_speculative_tokens=args.num_speculative_tokens, export_dir=export,
                          **({"budget_s": args.budget} if args.budget else {}))
    print(engine_markdown(section, full=args.full))
    print(f"engine step: {section.get('seconds')} s; work files in {work}")
    if args.json:
        args.json.write_text(json.dumps(section, indent=2))


if __name__ == "__main__":
    main()
