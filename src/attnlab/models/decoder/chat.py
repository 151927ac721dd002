"""The chat template a prompt is wrapped in before generation (SmolLM2-Instruct's ChatML)."""

from __future__ import annotations

__all__ = ["chat_prompt"]


def chat_prompt(text: str, *, system: str = "You are a helpful AI assistant named SmolLM, trained by Hugging Face") -> str:
    """``text`` as one user turn in the ChatML template that SmolLM2-Instruct was tuned on,
    ready for the assistant's answer."""
    return (f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{text}<|im_end|>\n"
            f"<|im_start|>assistant\n")
