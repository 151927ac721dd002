"""The reference for AttnLRP: the ``lxt`` package's own rules, applied to a transformers model.

lxt 2.1 on transformers 5 needs two adaptations, and nothing else is changed:

* ``import lxt.efficient`` imports every model map, and its BERT copy needs a function
  transformers 5 removed (and torchvision): ``lxt.efficient`` and ``lxt.efficient.models`` are
  put in ``sys.modules`` as empty packages on lxt's own folders, so that ``lxt.efficient.rules``,
  ``lxt.efficient.patches``, ``lxt.efficient.models.llama`` and the others import as they are;
* its ``patch_attention`` replaces the modeling module's ``ALL_ATTENTION_FUNCTIONS`` registry
  with a plain dict, which transformers 5's ``ALL_ATTENTION_FUNCTIONS.get_interface`` cannot
  use; so the model runs with ``attn_implementation="eager"`` and the module's
  ``eager_attention_forward`` is wrapped with lxt's ``wrap_attention_forward`` (what
  ``patch_attention`` does to it), the only adaptation of lxt's maps.

The MLP, norm and dropout patches are lxt's maps applied with lxt's ``patch_method``; every
patched attribute is put back when the block ends (other tests use the same classes).
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import types
from pathlib import Path
from typing import Iterator

import pytest
import torch


def _lxt_map(family: str) -> dict:
    """lxt's ``attnLRP`` patch map of a family (``llama``, ``qwen2``, ``qwen3``, ``gemma3``, ``gpt2``)."""
    lxt = pytest.importorskip("lxt", reason="lxt is the reference implementation of AttnLRP")
    folder = Path(lxt.__file__).parent / "efficient"
    for name, path in (("lxt.efficient", folder), ("lxt.efficient.models", folder / "models")):
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [str(path)]
            sys.modules[name] = package
    return importlib.import_module(f"lxt.efficient.models.{family}").attnLRP


@contextlib.contextmanager
def lxt_patched(family: str) -> Iterator[None]:
    """Inside the block, transformers' classes of ``family`` run lxt's AttnLRP rules (run the
    model with ``attn_implementation="eager"``)."""
    patch_map = _bert_map() if family == "bert" else _lxt_map(family)
    from lxt.efficient.patches import patch_method, wrap_attention_forward

    saved: list[tuple[object, str, bool, object]] = []

    def remember(owner: object, name: str) -> None:
        saved.append((owner, name, name in vars(owner), vars(owner).get(name)))

    try:
        for target, patch in patch_map.items():
            if isinstance(target, types.ModuleType):  # the modeling module: its attention function
                remember(target, "eager_attention_forward")
                target.eager_attention_forward = wrap_attention_forward(target.eager_attention_forward)
                continue
            method = patch.keywords.get("method_name", "forward") if hasattr(patch, "keywords") else "forward"
            remember(target, method)
            patch_method(patch.args[0], target, method_name=method)
        yield
    finally:
        for owner, name, had, value in reversed(saved):
            if had:
                setattr(owner, name, value)
            else:
                delattr(owner, name)


def lxt_relevance(model: torch.nn.Module, input_ids: torch.Tensor, family: str, positions, targets,
                  foils=None) -> torch.Tensor:
    """``[G, N]``: lxt's relevance of each ``targets[g]``'s logit at ``positions[g]`` (minus the
    foil's), as lxt's efficient examples compute it (``examples/quantized_gemma3.py``):
    ``inputs_embeds`` a leaf, ``logit.backward()``,
    ``(inputs_embeds * inputs_embeds.grad).sum(-1)``. ``model``: a transformers model opened
    with ``attn_implementation="eager"``."""
    rows = []
    with lxt_patched(family):
        for g, (position, target) in enumerate(zip(positions, targets)):
            embeddings = model.get_input_embeddings()(input_ids).detach().requires_grad_(True)
            logits = model(inputs_embeds=embeddings, use_cache=False).logits
            logit = logits[0, position, target]
            if foils is not None:
                logit = logit - logits[0, position, foils[g]]
            logit.backward()
            rows.append((embeddings.grad * embeddings).sum(-1)[0].detach())
    return torch.stack(rows)


def _bert_map() -> dict:
    """lxt's BERT rules (``lxt/efficient/models/bert.py``, a copy of transformers 4's modeling file
    that cannot import on transformers 5) as patches of transformers 5's classes: the LayerNorm
    and dropout patches of its map; its ``BertIntermediate`` and ``BertPooler`` forwards (the lines
    marked ``LXT``: ``identity_rule_implicit`` on the activation); its attention's ``divide_gradient``
    on the scores and on the context (each by 2) given as lxt's ``wrap_attention_forward`` on the
    eager function (queries and keys by 4, values by 2: the same gradients, by linearity)."""
    from functools import partial

    from transformers.models.bert import modeling_bert

    _lxt_map("llama")  # the stub packages
    from lxt.efficient.patches import dropout_forward, layer_norm_forward, patch_method
    from lxt.efficient.rules import identity_rule_implicit

    def intermediate_forward(self, hidden_states):
        hidden_states = self.dense(hidden_states)
        return identity_rule_implicit(self.intermediate_act_fn, hidden_states)

    def pooler_forward(self, hidden_states):
        pooled_output = self.dense(hidden_states[:, 0])
        return identity_rule_implicit(self.activation, pooled_output)

    return {
        torch.nn.LayerNorm: partial(patch_method, layer_norm_forward),
        torch.nn.Dropout: partial(patch_method, dropout_forward),
        modeling_bert.BertIntermediate: partial(patch_method, intermediate_forward),
        modeling_bert.BertPooler: partial(patch_method, pooler_forward),
        modeling_bert: None,
    }


def lxt_classifier_relevance(model: torch.nn.Module, input_ids: torch.Tensor, target: int) -> torch.Tensor:
    """``[T]``: lxt's relevance of a BERT classifier's ``target`` logit (opened with
    ``attn_implementation="eager"``), as :func:`lxt_relevance` computes it."""
    with lxt_patched("bert"):
        embeddings = model.get_input_embeddings()(input_ids).detach().requires_grad_(True)
        logit = model(inputs_embeds=embeddings).logits[0, target]
        logit.backward()
    return (embeddings.grad * embeddings).sum(-1)[0].detach()
