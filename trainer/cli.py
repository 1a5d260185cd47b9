"""`draftsmith` commands that drive the ML library directly (no service needed)."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import click

from trainer.errors import DraftsmithError


def user_errors(command):
    """Print a DraftsmithError as one line and exit 2, instead of a traceback."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except DraftsmithError as error:
            click.echo(f"error: {error}", err=True)
            sys.exit(2)

    return wrapper


@click.group()
def target() -> None:
    """Prepare and inspect target models."""


@target.command("prepare")
@click.argument("name")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), required=True, help="Directory to write.")
@user_errors
def target_prepare(name: str, out_dir: Path) -> None:
    """Materialise a bundled target (e.g. smollm2-135m) as a plain HF directory, offline."""
    from trainer.targets.bundled import prepare_bundled

    click.echo(prepare_bundled(name, out_dir))


@target.command("inspect")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--allow-pickle", is_flag=True, help="Accept pickle (*.bin) weights. Never for untrusted files.")
@user_errors
def target_inspect(path: Path, allow_pickle: bool) -> None:
    """Check a target directory and print what a drafter would be built from."""
    from trainer.targets import load_target
    from trainer.targets.chat import choose_mask_token_id

    loaded = load_target(path, allow_pickle=allow_pickle)
    mask_token_id, reason = choose_mask_token_id(loaded.tokenizer, loaded.vocab_size)
    click.echo(json.dumps({
        "model_type": loaded.config.model_type, "num_layers": loaded.num_layers,
        "hidden_size": loaded.hidden_size, "vocab_size": loaded.vocab_size,
        "tied_embeddings": bool(getattr(loaded.config, "tie_word_embeddings", False)),
        "mask_token_id": mask_token_id, "mask_token_rule": reason,
        "stop_token_ids": loaded.stop_token_ids(), "fingerprint": loaded.fingerprint,
    }, indent=2))


@click.command()
@click.option("--target", "target_dir", type=click.Path(path_type=Path), required=True)
@click.option("--drafter", "drafter_dir", type=click.Path(path_type=Path), default=None,
              help="Drafter directory; without it the target decodes alone.")
@click.option("--prompt", required=True, help="User message, rendered with the target's chat template.")
@click.option("--max-new-tokens", default=128, show_default=True)
@click.option("--temperature", default=0.0, show_default=True)
@click.option("--top-p", default=1.0, show_default=True)
@click.option("--top-k", default=0, show_default=True)
@click.option("--block-size", default=None, type=int, help="Defaults to the drafter's.")
@click.option("--seed", default=0, show_default=True)
@user_errors
def decode(target_dir, drafter_dir, prompt, max_new_tokens, temperature, top_p, top_k, block_size, seed) -> None:
    """Generate one response, speculatively when a drafter is given, and print tau and speed."""
    import torch

    from schemas.sampling import SamplingParams
    from trainer.drafter.checkpoint import load_drafter
    from trainer.speculative import SpeculativeDecoder
    from trainer.targets import load_target
    from trainer.targets.chat import render_prompt

    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=max_new_tokens,
                            seed=seed)
    loaded = load_target(target_dir)
    drafter = load_drafter(drafter_dir, loaded.device, loaded.dtype) if drafter_dir else None
    decoder = SpeculativeDecoder(loaded, drafter, block_size)
    ids = render_prompt(loaded.tokenizer, [{"role": "user", "content": prompt}], params.chat_template)
    result = decoder.generate(ids, params, generator=torch.Generator().manual_seed(seed))
    click.echo(loaded.tokenizer.decode(result.tokens, skip_special_tokens=True))
    seconds = result.prefill_seconds + result.decode_seconds
    click.echo(f"[{len(result.tokens)} tokens, tau {result.tau:.2f}, {len(result.tokens) / seconds:.1f} tokens/s]",
               err=True)
