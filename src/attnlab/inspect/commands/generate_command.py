"""``attnlab generate``: continue a prompt with a decoder; ``--report`` shows what each new token attended to."""

from __future__ import annotations

import argparse

from .resolve import add_dtype_argument

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
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--seed", type=int, default=None, help="seed of the sampling (same seed, same text)")
    parser.add_argument("--compile", action="store_true",
                        help="compile the decoding steps with torch.compile: faster steps after a "
                             "compilation of seconds to a minute (worth it for long generations)")
    parser.add_argument("--max-tokens", type=int, default=128,
                        help="beyond this many positions the report pools neighbouring positions")
    add_dtype_argument(parser)


def run(args: argparse.Namespace) -> int:
    # imported here so that `attnlab --help` and other subcommands stay quick
    from ...models.decoder.gguf_tokenizer import chat_prompt
    from .generate_text import generate_text
    from .resolve import dtype_line, resolve_model

    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    resolved = resolve_model(args.model, dtype=args.dtype)
    print(dtype_line(resolved))
    prompt = args.prompt
    if args.chat:
        if resolved.tokenizer.token_to_id("<|im_start|>") is None:
            raise ValueError(f"--chat wraps the prompt in ChatML, but {args.model}'s tokenizer has no <|im_start|>")
        prompt = chat_prompt(prompt)
    generation = generate_text(
        resolved.model, resolved.tokenizer, prompt, max_new_tokens=args.max_new_tokens, report_dir=args.report,
        max_tokens=args.max_tokens, model_name=args.model, do_sample=args.sample, temperature=args.temperature,
        top_k=args.top_k, top_p=args.top_p, seed=args.seed, compile=args.compile,
    )
    print(generation.text)
    for path in generation.files:
        print(f"wrote {path}")
    return 0
