"""Head patching on attnlab's decoders: the next-token logit at the last position is read."""

from __future__ import annotations

import torch

from attnlab.inspect.compute.patching import patch_heads
from attnlab.layers.decoder_config import DecoderConfig
from attnlab.models.decoder.causal_lm import DecoderForCausalLM


def _decoder() -> DecoderForCausalLM:
    torch.manual_seed(0)
    return DecoderForCausalLM(DecoderConfig(vocab_size=40, d_model=32, num_layers=2, num_heads=4, d_ff=64,
                                            max_len=64)).eval()


def test_patching_every_head_of_a_decoder_gives_the_source_runs_next_token_logit() -> None:
    model = _decoder()
    source, target = torch.tensor([[5, 9, 13, 17, 21]]), torch.tensor([[6, 10, 14, 18, 22]])
    result = patch_heads(model, source, target, {"layer_1": range(4), "layer_2": range(4)})
    with torch.no_grad():
        clean = model(target).logits[0, -1]
        from_source = model(source).logits[0, -1]
    assert result.label == int(clean.argmax())
    torch.testing.assert_close(result.clean, clean[result.label][None])
    torch.testing.assert_close(result.source, from_source[result.label][None])
    # the hooks sit on o_proj's input: patching one head changes the logit, and differently
    partial = patch_heads(model, source, target, {"layer_2": [0]})
    assert not torch.equal(partial.patched, result.patched)
    assert not torch.equal(partial.patched, partial.clean)
    assert torch.isclose(partial.clean, result.clean)
