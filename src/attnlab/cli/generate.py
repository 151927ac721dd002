"""``attnlab generate``: continue a prompt with a decoder; ``--report`` shows what each new token attended to.

With an encoder-decoder directory (T5, BART, Marian) the prompt is the source and the
report is the cross-attention of the generated target over it (target x source per layer and
head, and a step-through page).
"""

from __future__ import annotations

import argparse

from ._model_options import add_dtype_argument, add_placement_arguments, placement_from_args

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True,
                        help="a GPT-2 / Llama / Mistral / Qwen2 directory, a .gguf file, or smollm2")
    parser.add_argument("--prompt", required=True, help="the text to continue")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="tokens to generate")
    parser.add_argument("--chat", action="store_true",
                        help="wrap the prompt as one user turn of the ChatML template (SmolLM2-Instruct)")
    parser.add_argument("--report", default=None, metavar="DIR",
                        help="record every generated token's attention and write report.html, "
                             "generation.json and statistics.json here")
    parser.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    parser.add_argument("--temperature", type=float, default=None,
                        help="with --sample: divide the logits by this (default 1)")
    parser.add_argument("--top-k", type=int, default=None, help="with --sample: keep the K most likely tokens")
    parser.add_argument("--top-p", type=float, default=None,
                        help="with --sample: keep the smallest set of tokens whose probability reaches P")
    parser.add_argument("--seed", type=int, default=None, help="seed of the sampling (same seed, same text)")
    parser.add_argument("--compile", action="store_true",
                        help="compile the decoding steps with torch.compile: faster steps after a "
                             "compilation of seconds to a minute (worth it for long generations)")
    parser.add_argument("--verbose", action="store_true",
                        help="say how the decoding steps ran (attnlab's native step, or what ran "
                             "instead and why)")
    parser.add_argument("--max-tokens", type=int, default=128,
                        help="beyond this many positions the report pools neighbouring positions")
    add_dtype_argument(parser)
    add_placement_arguments(parser)


def run(args: argparse.Namespace) -> int:
    # imported here so that `attnlab --help` and other subcommands stay quick
    from .._files import check_output_dir
    from ..models.decoder.chat import chat_prompt
    from ..workflows.generate_text import generate_text
    from ._model_options import dtype_line
    from ..workflows.resolve import resolve_model

    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    shaping = [flag for flag, value in (("--temperature", args.temperature), ("--top-k", args.top_k),
                                        ("--top-p", args.top_p), ("--seed", args.seed)) if value is not None]
    if args.temperature is not None and not args.temperature > 0:
        raise ValueError(f"--temperature must be > 0 (leave out --sample for greedy decoding), got {args.temperature}")
    if args.top_k is not None and args.top_k < 1:
        raise ValueError(f"--top-k must be at least 1, got {args.top_k}")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise ValueError(f"--top-p must lie in (0, 1], got {args.top_p}")
    if shaping and not args.sample:
        raise ValueError(f"{', '.join(shaping)} shape(s) sampling, which greedy decoding ignores: add --sample, "
                         f"or leave {'it' if len(shaping) == 1 else 'them'} out")
    if args.report is not None:
        check_output_dir(args.report, "--report", "report.html, generation.json and statistics.json")
    resolved = resolve_model(args.model, dtype=args.dtype, placement=placement_from_args(args))
    print(dtype_line(resolved))
    prompt = args.prompt
    if args.chat:
        if resolved.tokenizer.token_to_id("<|im_start|>") is None:
            raise ValueError(f"--chat wraps the prompt in ChatML, but {args.model}'s tokenizer has no <|im_start|>")
        prompt = chat_prompt(prompt)
    if resolved.is_encoder_decoder:
        return _run_seq2seq(args, resolved, prompt)
    _check_length(resolved, prompt, args)
    generation = generate_text(
        resolved.model, resolved.tokenizer, prompt, max_new_tokens=args.max_new_tokens, report_dir=args.report,
        max_tokens=args.max_tokens, model_name=args.model, do_sample=args.sample,
        top_k=args.top_k, top_p=args.top_p, seed=args.seed, compile=args.compile,
        **({} if args.temperature is None else {"temperature": args.temperature}),
    )
    print(generation.text)
    if args.verbose:
        print(f"decoding: {generation.decoding}")
    for path in generation.files:
        print(f"wrote {path}")
    return 0


def _check_length(resolved, prompt: str, args: argparse.Namespace) -> None:
    """Refuse, before generating, more positions than the model has or a report too big to hold."""
    from .._checks import check_memory
    from ..workflows.explain_generation import context_limit

    config = getattr(resolved.model, "config", None)
    context = context_limit(resolved.model)  # transformers' decoders too: max_position_embeddings
    prompt_length = len(resolved.tokenizer.encode(prompt).ids)
    total = prompt_length + args.max_new_tokens
    if context is not None and prompt_length >= context:
        raise ValueError(
            f"the prompt has {prompt_length} tokens, and {args.model}'s context of {context} positions leaves no "
            f"room for a new one; shorten --prompt to at most {context - 1} tokens"
        )
    if context is not None and total > context:
        raise ValueError(
            f"--max-new-tokens {args.max_new_tokens} after the prompt's {prompt_length} tokens is more than "
            f"{args.model}'s context of {context} positions; ask for at most {context - prompt_length}"
        )
    if args.report is not None and config is not None:
        layers, heads = getattr(config, "num_layers", 1), getattr(config, "num_heads", 1)
        check_memory(2 * layers * heads * total * total, f"--report over {total} positions (every layer's "
                     f"and head's weights of every new token)", "ask for fewer --max-new-tokens")


def _run_seq2seq(args: argparse.Namespace, resolved, source: str) -> int:
    """An encoder-decoder: generate a target from ``source`` (greedy) and write its pages."""
    import torch

    from ..workflows.inspect_pair import encode_side, write_pair_inspection

    if args.sample or args.compile or args.chat:
        raise ValueError("--sample, --compile and --chat apply to decoder-only models; an encoder-decoder "
                         "generates greedily here (leave them out)")
    if args.report is None:
        source_ids, _ = encode_side(resolved.tokenizer, source, 512, "--prompt")
        with torch.no_grad():
            ids = resolved.model.model.generate(input_ids=source_ids[None], max_new_tokens=args.max_new_tokens,
                                                do_sample=False)[0, 1:]
        print(resolved.tokenizer.decode(ids.tolist()))
        return 0
    inspection = write_pair_inspection(resolved.model, resolved.tokenizer, source, args.report,
                                       max_new_tokens=args.max_new_tokens, max_tokens=args.max_tokens,
                                       model_name=args.model)
    print(" ".join(inspection.target_tokens[1:]))
    for path in inspection.figures + inspection.pages:
        print(f"wrote {path}")
    return 0
