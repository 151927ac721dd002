"""A speech clip through Whisper for the pair inspection: the transcript (greedy, or a given one
scored), its attention cut to the clip's own positions, readable token labels and word timestamps
in seconds (what ``attnlab inspect --audio`` and ``attnlab align --audio`` show).

Dimension letters: ``H`` heads, ``T`` decoder input tokens, ``S`` encoder positions (the whole
window: 1,500 for Whisper's 30 s), ``P`` the positions the clip covers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import nn

from ..hf.audio import AudioFeatures, greedy_target, speech_prompt
from ..hf.seq2seq import PairAttention, pair_attention
from ..hf.speech_alignment import WordTiming, word_timestamps

__all__ = ["SpeechPair", "open_speech_model", "speech_pair", "token_label"]


def open_speech_model(spec: str, *, dtype: str, placement: Any = None, otherwise: str = "") -> Any:
    """``--model`` for ``--audio``: a transformers speech encoder-decoder directory (Whisper),
    opened under attnlab's attention (a :class:`~attnlab.hf.opening.TransformersModel`).

    Raises:
        ValueError: ``spec`` is not a transformers directory, or holds no speech
            encoder-decoder (``otherwise`` ends the message: what to do with that model).
    """
    from pathlib import Path

    from ..hf.opening import is_transformers_only, open_transformers

    if not Path(spec).is_dir() or not is_transformers_only(spec):
        raise ValueError(f"--audio takes a transformers speech model directory (Whisper: config.json + "
                         f"safetensors); {spec} is not one")
    model = open_transformers(spec, dtype=dtype, placement=placement)
    config = model.model.config
    if not getattr(config, "is_encoder_decoder", False) or not hasattr(config, "num_mel_bins"):
        raise ValueError(f"--audio needs a speech encoder-decoder (Whisper); {spec} holds "
                         f"{type(model.model).__name__}{otherwise}")
    return model


@dataclass
class SpeechPair:
    """One clip and its transcript.

    Attributes:
        pair: the attention, the source side cut to the clip's ``P`` positions (encoder ``[H, P, P]``,
            cross ``[H, T, P]``: the weights as computed over the whole window, the padding's columns
            left out).
        source_tokens: ``["0.00s", "0.02s", ...]``: each kept position's start time.
        target_tokens: the decoder's input as text (``" quick"``, ``"<|notimestamps|>"``).
        prompt: the decoder's prompt (start token, then forced or no-timestamps tokens).
        transcript: the text after the prompt (special tokens left out).
        words: the words with their times in seconds (empty without a tokenizer).
    """

    pair: PairAttention
    source_tokens: list[str]
    target_tokens: list[str]
    prompt: list[int]
    transcript: str = ""
    words: list[WordTiming] = field(default_factory=list)


def token_label(tokenizer: Any, index: int) -> str:
    """A token as the text it stands for (``" quick"``, not byte-level BPE's ``"Ġquick"``)."""
    if tokenizer is None:
        return f"<{int(index)}>"
    text = tokenizer.decode([int(index)], skip_special_tokens=False)
    return text if text else (tokenizer.id_to_token(int(index)) or f"<{int(index)}>")


def speech_pair(model: nn.Module, tokenizer: Any, clip: AudioFeatures, *, target: Optional[str] = None,
                max_new_tokens: int = 20) -> SpeechPair:
    """Transcribe ``clip`` greedily (or score ``target``), record its attention and time its words.

    Args:
        model: a transformers speech encoder-decoder (Whisper).
        tokenizer: its ``tokenizers.Tokenizer`` (``None``: tokens shown by id, no words).
        clip: :func:`~attnlab.hf.audio.audio_features` of the clip.
        target: a transcript to score instead of the model's own.
        max_new_tokens: tokens of the greedy transcript.
    """
    prompt = speech_prompt(model)
    end = getattr(model.config, "eos_token_id", None)
    if target is None:
        decoder_ids = greedy_target(model, clip.features, prompt=prompt, max_new_tokens=max_new_tokens)
    else:
        if not target.strip():
            raise ValueError("--target is empty: give the transcript to score, or leave it out for the model's own")
        text_ids = tokenizer.encode(" " + target.strip(), add_special_tokens=False).ids
        decoder_ids = torch.tensor(prompt + list(text_ids))  # [T]
    pair = pair_attention(model, None, decoder_ids, source_features=clip.features)
    P = min(clip.positions, next(iter(pair.cross.values())).shape[-1])
    pair.cross = {name: weights[:, :, :P] for name, weights in pair.cross.items()}  # [H, T, P]
    pair.encoder = {name: weights[:, :P, :P] for name, weights in pair.encoder.items()}  # [H, P, P]
    text = [token for token in decoder_ids.tolist()[len(prompt):] if token != end]
    result = SpeechPair(pair, clip.position_labels(P), [token_label(tokenizer, t) for t in decoder_ids.tolist()],
                        prompt)
    if tokenizer is not None and text:
        result.transcript = tokenizer.decode(text, skip_special_tokens=True).strip()
        result.words = word_timestamps(model, tokenizer, clip, text, prompt=prompt).words
    return result
