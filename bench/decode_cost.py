"""Bench: what a trained drafter costs and buys when decoding, batch 1, on this machine.

Measures separately (median of repeats, after a warm-up) the cost of verifying b tokens with the target
(b = 1 is a plain decode step) and of drafting a block of b (drafter + LM head over the draft vocabulary +
selector walk), for every b and every draft-vocabulary size asked for; the held-out acceptance at the
trained block size for each vocabulary (replayed, trainer/validation/replay.py); the speedup those imply
per b; and then the measured tokens/s of the target alone and of speculative decoding at the best
(vocabulary, b) and at the full head and full block, prompt by prompt, interleaved, with the load average.

    python -m bench.decode_cost --drafter RUN/drafter --data DATA --references STUDY/references \
        [--vocab-sizes 0,8192,16384] [--timed-prompts 12] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto",
                        help="Where the target runs: auto (a GPU if any, else the CPU), cpu, cuda or cuda:N.")
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--drafter", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True, help="The regenerated data the drafter was trained on "
                                                                 "(ranks the draft vocabulary).")
    parser.add_argument("--references", type=Path, required=True, help="Held-out greedy references "
                                                                        "(bench/recipe_study.py writes them).")
    parser.add_argument("--vocab-sizes", default="0,8192,16384", help="0: the full vocabulary.")
    parser.add_argument("--timed-prompts", type=int, default=12)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, default=None, help="Write the figures as JSON here.")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from schemas.sampling import SamplingParams
    from trainer.data.store import DataStore
    from trainer.device import load_target_on
    from trainer.drafter.checkpoint import load_drafter
    from trainer.drafter.draft_vocab import coverage, frequency_ranked_vocab
    from trainer.speculative import SpeculativeDecoder
    from trainer.targets.bundled import resolve_target_path
    from trainer.validation.replay import load_references, replay_acceptance
    from trainer.validation.report import measure_step_costs

    target = load_target_on(resolve_target_path(args.target), args.device)
    drafter = load_drafter(args.drafter)
    block = drafter.config.block_size
    responses = [e.input_ids[e.prompt_len:] for e in DataStore.open(args.data).examples(with_hidden=False,
                                                                                         with_teacher=False)]
    references = load_references(args.references)
    held_out = [r.tokens[r.prompt_len:] for r in references]
    figures: dict = {"threads": args.threads, "block_size": block, "vocabularies": {}}
    prompt = references[0].tokens[:references[0].prompt_len]
    best = (0.0, None, None)
    for size in (int(v) for v in args.vocab_sizes.split(",")):
        drafter.draft_vocab = (frequency_ranked_vocab(responses, target.vocab_size, size, target.stop_token_ids())
                               if size else None)
        load = os.getloadavg()[0]
        costs = measure_step_costs(target, drafter, prompt, repeats=args.repeats)
        result = replay_acceptance(target, drafter, references)
        stats = result.stats.overall
        speedups = {b: stats.expected_tau(b) * costs["verify"][1] / (costs["draft"][b] + costs["verify"][b])
                    for b in range(2, block + 1)}
        entry = {
            "size": size or target.vocab_size,
            "held_out_coverage": round(coverage(held_out, drafter.draft_vocab), 4) if size else 1.0,
            "tau": round(stats.tau, 4), "per_position": [round(a or 0, 3) for a in stats.per_position],
            "expected_tau": {b: round(stats.expected_tau(b), 3) for b in range(2, block + 1)},
            "verify_ms": {b: round(v * 1e3, 2) for b, v in costs["verify"].items()},
            "draft_ms": {b: round(v * 1e3, 2) for b, v in costs["draft"].items()},
            "estimated_speedup": {b: round(v, 3) for b, v in speedups.items()},
            "load": [round(load, 2), round(os.getloadavg()[0], 2)],
        }
        figures["vocabularies"][size or target.vocab_size] = entry
        print(json.dumps(entry), flush=True)
        b = max(speedups, key=speedups.get)
        if speedups[b] > best[0]:
            best = (speedups[b], size, b)

    # Measured: the target alone against speculative decoding, prompt by prompt, interleaved.
    greedy = SamplingParams(temperature=0.0, max_new_tokens=args.max_new_tokens)
    _, size, b = best
    settings = {"best": (size, b), "full head, full block": (0, block)}
    decoders = {}
    for name, (vocab, length) in settings.items():
        drafter.draft_vocab = (frequency_ranked_vocab(responses, target.vocab_size, vocab, target.stop_token_ids())
                               if vocab else None)
        decoders[name] = SpeculativeDecoder(target, drafter, block_size=length)
    plain = SpeculativeDecoder(target)
    totals = {name: [0.0, 0, 0, 0] for name in ["target alone", *decoders]}  # seconds, tokens, cycles, emitted
    load = os.getloadavg()[0]
    for reference in references[:args.timed_prompts]:
        prompt = reference.tokens[:reference.prompt_len]
        expected = None
        for name, decoder in [("target alone", plain), *decoders.items()]:
            started = time.perf_counter()
            out = decoder.generate(prompt, greedy)
            seconds = time.perf_counter() - started
            expected = expected or out.tokens
            assert out.tokens == expected, f"{name}: output differs from the target's on {reference.prompt_id}"
            total = totals[name]
            total[0] += seconds
            total[1] += len(out.tokens)
            total[2] += len(out.cycles)
            total[3] += sum(out.acceptance_lengths)
    base = totals["target alone"][1] / totals["target alone"][0]
    figures["measured"] = {
        name: {"tokens_per_s": round(t[1] / t[0], 2), "speedup": round(t[1] / t[0] / base, 3),
               "tau": round(t[3] / max(1, t[2]), 3),
               "vocabulary": settings.get(name, (None,))[0], "block_size": settings.get(name, (None, 1))[1]}
        for name, t in totals.items()
    }
    figures["measured_load"] = [round(load, 2), round(os.getloadavg()[0], 2)]
    figures["timed_prompts"] = args.timed_prompts
    print(json.dumps(figures["measured"], indent=2), "load", figures["measured_load"])
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
