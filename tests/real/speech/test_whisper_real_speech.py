"""Whisper tiny.en on spoken sentences through attnlab: its transcripts (word error rate) and its word
timestamps from cross-attention against the words' true times; a random Whisper of the same shape
times the same words far worse. ``pytest -s`` prints the figures."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers

from attnlab.checkpoints.encoders.loading import load_tokenizer
from attnlab.data.audio import read_wav
from attnlab.hf.audio import audio_features, greedy_target, speech_prompt
from attnlab.hf.speech_alignment import word_timestamps
from speech import word_error_rate

MEAN_BOUNDARY_ERROR = 0.25  # seconds, starts and ends together; tiny.en measured 0.10-0.21, a random model ~0.9


@pytest.fixture(scope="module")
def real(whisper_tiny):
    model = transformers.WhisperForConditionalGeneration.from_pretrained(whisper_tiny).eval()
    return model, load_tokenizer(whisper_tiny)


def _clip(directory, model, wav):
    samples, rate = read_wav(wav)
    return audio_features(directory, model, samples, rate)


def _boundary_errors(model, tokenizer, directory, spoken) -> np.ndarray:
    """``[words, 2]``: |start error|, |end error| in seconds of every word of every sentence."""
    errors = []
    for sentence in spoken:
        clip = _clip(directory, model, sentence.wav)
        reference = tokenizer.encode(" " + sentence.text, add_special_tokens=False).ids
        timed = word_timestamps(model, tokenizer, clip, reference).words
        assert [word.word for word in timed] == [word.word for word in sentence.words]
        for got, truth in zip(timed, sentence.words):
            errors.append((abs(got.start - truth.start), abs(got.end - truth.end)))
            print(f"  {truth.word:>10}: true {truth.start:.2f}-{truth.end:.2f} s, "
                  f"found {got.start:.2f}-{got.end:.2f} s")
    return np.array(errors)


def _summary(name: str, errors: np.ndarray) -> str:
    return (f"{name}: mean start error {errors[:, 0].mean():.3f} s, end {errors[:, 1].mean():.3f} s, "
            f"both {errors.mean():.3f} s; worst start {errors[:, 0].max():.3f} s, end {errors[:, 1].max():.3f} s")


def test_the_converted_model_is_whisper_tiny_en(whisper_tiny, real):
    model, tokenizer = real
    config = json.loads((whisper_tiny / "config.json").read_text())
    assert (config["d_model"], config["encoder_layers"], config["decoder_layers"], config["vocab_size"],
            config["num_mel_bins"]) == (384, 4, 4, 51864, 80)
    assert model.generation_config.alignment_heads[:3] == [[1, 0], [2, 0], [2, 5]]
    assert model.proj_out.weight.data_ptr() == model.model.decoder.embed_tokens.weight.data_ptr()
    assert speech_prompt(model) == [50257, 50362]  # <|startoftranscript|> <|notimestamps|>
    assert model.model.encoder.layers[0].self_attn.k_proj.bias is None


def test_whisper_transcribes_spoken_sentences_through_attnlab(whisper_tiny, real, spoken):
    model, tokenizer = real
    rates = []
    for sentence in spoken:
        clip = _clip(whisper_tiny, model, sentence.wav)
        prompt = speech_prompt(model)
        ids = greedy_target(model, clip.features, prompt=prompt, max_new_tokens=40)[len(prompt):].tolist()
        transcript = tokenizer.decode(ids, skip_special_tokens=True).strip()
        rates.append(word_error_rate(sentence.text, transcript))
        print(f"{sentence.text!r} -> {transcript!r}: WER {rates[-1]:.2f}")
    print(f"mean WER {np.mean(rates):.3f}")
    assert max(rates) <= 0.2 and np.mean(rates) <= 0.1


def test_word_timestamps_from_cross_attention_find_the_spoken_words(whisper_tiny, real, spoken):
    model, tokenizer = real
    errors = _boundary_errors(model, tokenizer, whisper_tiny, spoken)
    print(_summary("whisper tiny.en", errors))
    assert errors.mean() < MEAN_BOUNDARY_ERROR
    assert errors[:, 0].mean() < 0.15 and errors.max() < 0.5


def test_a_random_whisper_of_the_same_shape_misses_the_words(whisper_tiny, real, spoken):
    model, tokenizer = real
    torch.manual_seed(0)
    random = transformers.WhisperForConditionalGeneration(model.config).eval()
    random.generation_config = model.generation_config  # the same prompt and alignment heads
    errors = _boundary_errors(random, tokenizer, whisper_tiny, spoken)
    print(_summary("random whisper", errors))
    assert errors.mean() >= MEAN_BOUNDARY_ERROR
