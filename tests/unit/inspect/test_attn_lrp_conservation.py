"""Where AttnLRP's relevance goes: every rule conserves it but the softmax's (gradient x input on
the scores, the paper's Proposition 3.1), and biases and position embeddings take their share.

The test accounts for all of it, in float64, on tiny random models served by attnlab's backend:

    logit = sum(token relevances) + sum(bias relevances) + sum(position-embedding relevances)
            + what each softmax absorbed

A bias ``b`` added to an output ``y`` takes ``b * dy`` (gradient x input, as the tokens); a softmax
with weights ``A`` and gradient ``g = d logit / dA`` receives ``A g / 2`` (``A V`` gives half to
``A``) and passes ``s dA/ds g / 2 = A log(A) (g - <g>_A) / 2`` on to its scores (``s = log A`` up
to a constant that cancels), so it absorbs the difference. With nothing else left, the identity
holds to rounding: every norm, activation, gated product and residual sum conserves. The sums
of the relevances alone are measured, not asserted (the absorbed share is the method's own).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnlab.hf.opening import as_inspectable
from attnlab.inspect.compute.attn_lrp import attn_lrp_generation
from attnlab.inspect.compute.attn_lrp_rules import attn_lrp_rules
from attnlab.inspect.compute.inspectable import inspectable
from attnlab.models.decoder import DecoderForCausalLM

from test_attn_lrp import IDS, P, tiny  # tests/unit/inspect/test_attn_lrp.py

transformers = pytest.importorskip("transformers")


def _accounts(model: nn.Module, input_ids: torch.Tensor, position: int, token: int) -> dict[str, float]:
    """The explained logit and where its relevance went, for one forward under the rules."""
    view = inspectable(model)
    outputs: dict[str, list] = {"tokens": [], "positions": [], "biases": []}
    handles = []

    def keep(kind: str, bias=None):
        def hook(module, args, output):
            if kind == "tokens":
                output = output.detach().requires_grad_(True)
            outputs[kind].append((output, bias))
            return output
        return hook

    embedding = view.input_embeddings()
    handles.append(embedding.register_forward_hook(keep("tokens")))
    for module in model.modules():
        if module is embedding:
            continue
        if isinstance(module, nn.Embedding):  # GPT-2's learned positions, added to the tokens
            handles.append(module.register_forward_hook(keep("positions")))
        bias = getattr(module, "bias", None)
        if isinstance(bias, nn.Parameter):
            handles.append(module.register_forward_hook(keep("biases", bias)))
    try:
        with attn_lrp_rules(model), view.record(grad=True) as seen, torch.enable_grad():
            logit = model(input_ids).logits[0, position, token]
            attentions = seen.attentions  # {path: weights} (attnlab's) or a LayerAttentions tuple
            weights = list(attentions.values()) if isinstance(attentions, dict) else list(attentions)
            tensors = [t for kind in outputs for t, _ in outputs[kind]]
            gradients = torch.autograd.grad(logit, tensors + weights, allow_unused=True)
    finally:
        for handle in handles:
            handle.remove()
    found = dict(zip(map(id, tensors), gradients[:len(tensors)]))
    sums = {"logit": float(logit.detach())}
    for kind in outputs:
        total = 0.0
        for tensor, bias in outputs[kind]:
            gradient = found[id(tensor)]
            if gradient is not None:
                value = tensor if bias is None else bias.expand_as(tensor)
                total += float(value.detach().mul(gradient).sum())
        sums[kind] = total
    absorbed = 0.0
    for A, g in zip(weights, gradients[len(tensors):]):
        A = A.detach()
        mean = (A * g).sum(-1, keepdim=True)  # <g>_A per query row
        absorbed += float(0.5 * ((A * g).sum() - (torch.xlogy(A, A) * (g - mean)).sum()))
    sums["softmax"] = absorbed
    return sums


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3", "qwen2", "gpt2"])
def test_relevance_accounted_for(family):
    model = as_inspectable(tiny(family).double())
    relevance = attn_lrp_generation(model, IDS, P)  # the fused path; the accounts take the exact one
    for g in range(3):
        position, token = P - 1 + g, int(IDS[0, P + g])
        sums = _accounts(model, IDS, position, token)
        explained = sums["tokens"] + sums["positions"] + sums["biases"] + sums["softmax"]
        # float64 but for the norms' statistic and the exact path's softmax (float32, as eager's)
        assert explained == pytest.approx(sums["logit"], abs=1e-6 * abs(sums["logit"]))
        assert float(relevance.logit[g]) == pytest.approx(sums["logit"], abs=1e-5 * abs(sums["logit"]))
        assert float(relevance.total[g]) == pytest.approx(sums["tokens"], abs=1e-5 * abs(sums["logit"]))
        if family in ("llama", "qwen3", "gemma3"):  # bias-free: the softmax's share is the whole gap
            assert sums["biases"] == sums["positions"] == 0.0
        else:
            assert sums["biases"] != 0.0


def test_attnlabs_own_decoder_accounted_for(tmp_path):
    tiny("llama").save_pretrained(tmp_path)
    own = DecoderForCausalLM.from_pretrained(tmp_path).eval().double()
    sums = _accounts(own, IDS, P - 1, int(IDS[0, P]))
    assert sums["tokens"] + sums["softmax"] == pytest.approx(sums["logit"], abs=1e-6 * abs(sums["logit"]))
    assert sums["biases"] == sums["positions"] == 0.0
