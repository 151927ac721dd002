"""A decoder's tokenizer that adds ``<bos>`` to every text (Gemma's) must not put one before
the explained continuation, target or foil: those follow the prompt."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer as Backend, models, pre_tokenizers, processors

from attnlab.layers.decoder_config import DecoderConfig
from attnlab.models.decoder import DecoderForCausalLM
from attnlab.data.tokenizer import Tokenizer
from attnlab.workflows.explain_generation import explain_generation

WORDS = ["<pad>", "<bos>", "a", "b", "c", "d", "e"]


def _bos_tokenizer() -> Tokenizer:
    backend = Backend(models.WordLevel({word: index for index, word in enumerate(WORDS)}, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    return Tokenizer(backend)


def _decoder() -> DecoderForCausalLM:
    torch.manual_seed(0)
    return DecoderForCausalLM(DecoderConfig(vocab_size=len(WORDS), d_model=16, num_layers=1, num_heads=2,
                                            d_ff=32)).eval()


def test_a_continuation_follows_the_prompt_without_a_second_bos():
    explanation = explain_generation(_decoder(), _bos_tokenizer(), "a b c", ["occlusion"], continuation="d e",
                                     lens=False)[0]
    assert explanation.tokens == ["<bos>", "a", "b", "c", "d", "e"]
    assert explanation.prompt_length == 4 and len(explanation.scores["occlusion"]) == 2


def test_a_target_and_foil_are_single_tokens_without_the_bos():
    explanation = explain_generation(_decoder(), _bos_tokenizer(), "a b c", ["occlusion"], target="d", foil="e",
                                     lens=False)[0]
    assert explanation.tokens[-1] == "d" and explanation.foil == "e"
