"""Decoder-only language models: GPT-2 and the Llama family, with generation and a KV cache."""

from ...layers.decoder_config import DecoderConfig
from ...layers.kv_cache import KVCache
from .causal_lm import DecoderForCausalLM
from .generation import GenerationOutput, generate
from .chat import chat_prompt
from .outputs import CausalLMOutput

__all__ = ["CausalLMOutput", "DecoderConfig", "DecoderForCausalLM", "GenerationOutput", "KVCache", "chat_prompt",
           "generate"]
