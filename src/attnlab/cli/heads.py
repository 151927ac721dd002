"""``attnlab heads``: which heads look back one token, copy duplicates, do induction or park on
the first token; scored on repeated random tokens (or a prompt), with the repeated-tokens losses."""

from __future__ import annotations

import argparse

from ._model_options import MODEL_HELP, add_dtype_argument, add_placement_arguments, placement_from_args


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help=MODEL_HELP + " (a decoder)")
    parser.add_argument("--out", required=True, help="output directory (heads.json, heads-ROLE.png)")
    parser.add_argument("--length", type=int, default=50,
                        help="random tokens per copy of the repeated sequence (default 50)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random tokens")
    parser.add_argument("--prompt", default=None,
                        help="score the heads on this text instead of repeated random tokens (no losses then)")
    add_dtype_argument(parser)
    add_placement_arguments(parser)


def _special_ids(model) -> tuple:
    config = getattr(model, "config", None)
    found = []
    for name in ("bos_id", "bos_token_id", "eos_id", "eos_token_id", "pad_id", "pad_token_id"):
        value = getattr(config, name, None)
        found += list(value) if isinstance(value, (list, tuple)) else [value]
    return tuple(value for value in found if isinstance(value, int) and not isinstance(value, bool))


def run(args: argparse.Namespace) -> int:
    import torch

    from .._files import check_output_dir, write_json
    from ..inspect.compute.attribution_target import is_causal_model
    from ..inspect.compute.head_roles import HEAD_ROLES, find_head_roles
    from ..inspect.draw.head_roles import plot_head_role
    from ..inspect.draw.plots import save_figure
    from ..workflows.explain_generation import context_limit
    from ._model_options import dtype_line
    from ..workflows.resolve import resolve_model

    if args.prompt is None and args.length < 2:
        raise ValueError(f"--length must be at least 2 (tokens per copy), got {args.length}")
    if args.prompt is not None and not args.prompt.strip():
        raise ValueError("--prompt must be a non-empty text")
    check_output_dir(args.out, "--out", "heads.json and heads-ROLE.png")
    resolved = resolve_model(args.model, dtype=args.dtype, placement=placement_from_args(args))
    resolved.refuse_encoder_decoder("heads finds the roles of a decoder-only language model's heads",
                                    "attnlab analyze --data gives its per-head statistics")
    if not is_causal_model(resolved.model):
        raise ValueError(f"heads needs a decoder (a causal language model: GPT-2, the Llama family, smollm2); "
                         f"{args.model} is an encoder: attnlab analyze --data gives its per-head statistics")
    print(dtype_line(resolved))
    model = resolved.model
    limit = context_limit(model)
    config = getattr(model, "config", None)
    if args.prompt is not None:
        ids = resolved.tokenizer.encode(args.prompt).ids
        if not ids:
            raise ValueError(f"the tokenizer produced no token for --prompt {args.prompt!r}")
        if limit is not None and len(ids) > limit:
            raise ValueError(f"--prompt has {len(ids)} tokens, past the {limit} positions {args.model} takes; "
                             f"shorten --prompt")
        roles = find_head_roles(model, torch.tensor([ids]))
        source = {"prompt": args.prompt}
    else:
        bos = getattr(config, "bos_id", getattr(config, "bos_token_id", None))
        bos = bos if isinstance(bos, int) and not isinstance(bos, bool) else None
        needed = 2 * args.length + (bos is not None)
        if limit is not None and needed > limit:
            raise ValueError(f"--length {args.length} makes {needed} positions, past the {limit} {args.model} "
                             f"takes; pass --length {(limit - (bos is not None)) // 2} or less")
        roles = find_head_roles(model, length=args.length, seed=args.seed, bos_id=bos, exclude=_special_ids(model))
        source = {"repeated_random_tokens": {"length": args.length, "seed": args.seed, "first_token": bos}}
    out = check_output_dir(args.out)
    out.mkdir(parents=True, exist_ok=True)
    strongest = {role: [{"layer": layer, "head": head, "score": round(score, 6)}
                        for layer, head, score in roles.strongest(role, 3)] for role in HEAD_ROLES}
    repeated = None if roles.repeated_tokens is None else {
        "first_copy": roles.repeated_tokens.first_copy, "second_copy": roles.repeated_tokens.second_copy}
    write_json(out / "heads.json", {
        "model": args.model, "input": source, "input_ids": roles.input_ids[0].tolist(),
        "definitions": "score = attention mass on the role's pattern, averaged over the query rows that have a "
                       "pattern position (attnlab.inspect.compute.head_roles)",
        "scores": {role: [[None if value != value else round(value, 6) for value in row]
                          for row in roles.scores[role].tolist()] for role in HEAD_ROLES},
        "strongest": strongest, "repeated_tokens": repeated})
    written = [out / "heads.json"]
    for role in HEAD_ROLES:
        written += save_figure(plot_head_role(roles.scores[role].tolist(), role, title=args.model),
                               out / f"heads-{role}", ("png",))
    print("strongest heads (layer.head: score, counted from 1):")
    for role in HEAD_ROLES:
        print(f"  {role:16s} " + "  ".join(f"{h['layer']}.{h['head']}: {h['score']:.3f}" for h in strongest[role]))
    if repeated is not None:
        print(f"repeated random tokens ({args.length} twice): loss on the first copy {repeated['first_copy']:.3f}, "
              f"on the second {repeated['second_copy']:.3f} nats per token")
    for path in written:
        print(f"wrote {path}")
    return 0
