"""The census: one verdict per architecture, from the installed transformers."""

from __future__ import annotations

import inspect

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the census needs the hf extra")

from attnlab.inspect.compute import routing  # noqa: E402
from attnlab.hf.census import census, write_table  # noqa: E402


def _routes(model_type: str) -> bool:
    """Whether the installed transformers' modeling source of ``model_type`` uses the registry."""
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    module = inspect.getmodule(getattr(transformers, MODEL_MAPPING_NAMES[model_type]))
    return "ALL_ATTENTION_FUNCTIONS" in inspect.getsource(module)


def test_verdicts_follow_the_installed_transformers(tmp_path):
    # one of each kind: decoder, encoder, encoder-decoder, two towers, vision, speech (mel and raw
    # audio), vision-language; and two refusals
    sample = ["llama", "bert", "t5", "clip", "vit_mae", "whisper", "wav2vec2", "llava", "bloom", "albert"]
    verdicts = {v.model_type: v for v in census(sample)}
    for served in ("llama", "bert", "t5", "clip", "vit_mae", "whisper", "wav2vec2", "llava"):
        assert verdicts[served].verdict == "served", verdicts[served]
        assert verdicts[served].outputs == 0.0 and verdicts[served].weights <= 1e-5
        assert verdicts[served].head_mask is None or verdicts[served].head_mask <= 1e-5
    kinds = {"llama": "decoder", "bert": "encoder", "t5": "encoder-decoder", "clip": "two towers", "vit_mae": "vision",
             "wav2vec2": "speech", "llava": "vision-language", "bloom": "decoder"}
    assert {name: verdicts[name].kind for name in kinds} == kinds
    # BLOOM computes its attention in the module in some releases: refused there, with attach's line
    assert verdicts["bloom"].verdict == ("served" if _routes("bloom") else "refused")
    if verdicts["bloom"].verdict == "refused":
        assert "without transformers' AttentionInterface" in verdicts["bloom"].reason
    assert verdicts["albert"].verdict == "refused" and "runs more than once" in verdicts["albert"].reason
    write_table(list(verdicts.values()), tmp_path / "table.md")
    table = (tmp_path / "table.md").read_text()
    assert f"transformers {transformers.__version__}" in table and "| llama | `LlamaModel` | decoder | served |" in table


def test_an_encoder_whose_attention_sets_no_is_causal_is_served_bidirectional():
    """Splinter's and ALIGN's text attention set no ``is_causal``: on a batch without padding
    the mask builder leaves the mask out, and they attended causally (the census found them
    differing from eager). Their modeling files build bidirectional masks only."""
    verdicts = census(["splinter", "align_text_model"])
    assert [v.verdict for v in verdicts] == ["served", "served"], verdicts


def test_weights_that_differ_from_eager_are_reported_not_served(monkeypatch):
    """The census's checks can fail: weights scaled by attnlab's kernel are caught."""
    exact = routing.exact_attention

    def scaled(*args, **kwargs):
        output, weights = exact(*args, **kwargs)
        return output, None if weights is None else weights * 0.5

    monkeypatch.setattr(routing, "exact_attention", scaled)
    verdict, = census(["llama"])
    assert verdict.verdict == "differs" and "weights differ from eager's" in verdict.reason


def test_an_unknown_model_type_is_refused_in_one_line():
    with pytest.raises(ValueError, match="unknown model type 'lama'"):
        census(["lama"])
    assert torch.get_default_dtype() == torch.float32


def test_inputs_of_every_form_the_rule_reaches():
    """Forms beyond one text or one image: frames of a video (VideoMAE), one image per text
    (SmolVLM), flattened patches on a grid (the Qwen2-VL language tower's multimodal rotary
    sections), features laid frames first (Speech2Text), latent attention (DeepSeek-V3)."""
    sample = ["videomae", "smolvlm", "qwen2_vl_text", "speech_to_text", "deepseek_v3"]
    verdicts = census(sample)
    assert [v.verdict for v in verdicts] == ["served"] * len(sample), verdicts


def test_the_head_mask_check_can_fail():
    """The census's head mask reference zeroes head 2's output; attach masking head 1 instead
    is caught, and the right head gives the reference exactly."""
    from attnlab.hf._sites import attention_sites
    from attnlab.hf.census import _head_mask_difference
    from attnlab.hf.census_models import model_inputs, shrink

    config = shrink(transformers.LlamaConfig())
    torch.manual_seed(0)
    model = transformers.LlamaModel(config).eval()
    inputs = model_inputs(model, config)[0]
    sites = attention_sites(model)
    assert _head_mask_difference(model, inputs, sites, "sdpa") <= 1e-6
    assert _head_mask_difference(model, inputs, sites, "sdpa", masked=0) > 1e-3
    assert _head_mask_difference(model, inputs, sites, "eager") is None


def test_a_decoder_that_says_it_is_not_causal_gets_its_causal_mask():
    """NLLB-MoE's decoder attention says ``is_causal=False`` and relies on the mask it builds;
    transformers' sdpa does not serve it, and sdpa's mask builder leaves a causal mask out: the
    census found its outputs 0.06 from eager's. attnlab builds every mask of such models."""
    verdict, = census(["nllb-moe"])
    assert verdict.verdict == "served" and verdict.outputs <= 1e-5, verdict


@pytest.mark.skipif(not __import__("os").environ.get("ATTNLAB_WHOLE_CENSUS"),
                    reason="the whole census runs in `make test-latest` (ATTNLAB_WHOLE_CENSUS=1)")
def test_the_whole_census(tmp_path):
    """Every model type the installed transformers provides gets a verdict; at least 300 are
    served at parity; nothing differs but the known differences, each with its reason."""
    from attnlab.hf.census import KNOWN_DIFFERENCES

    verdicts = census()
    write_table(verdicts, tmp_path / "census.md")
    served = sum(v.verdict == "served" for v in verdicts)
    unknown = [(v.model_type, v.reason) for v in verdicts
               if v.verdict == "differs" and v.model_type not in KNOWN_DIFFERENCES]
    assert served >= 300 and not unknown, (served, unknown)
    assert all(v.reason for v in verdicts if v.verdict in ("refused", "not built"))


def test_the_command_checks_its_arguments_before_the_work(tmp_path, capsys):
    from attnlab.hf.census import main

    for argv, message in ((["--only", "lama"], "no model type 'lama' (did you mean llama"),
                          (["--only", "llama", "--out", str(tmp_path / "missing" / "c.md")], "no writable folder"),
                          (["--only", "llama", "--out", str(tmp_path)], "a directory, not a file")):
        with pytest.raises(SystemExit) as stopped:
            main(argv)
        assert stopped.value.code == 2 and message in capsys.readouterr().err
    assert main(["--only", "llama", "--out", str(tmp_path / "c.md")]) == 0
    assert "| llama | `LlamaModel` | decoder | served |" in (tmp_path / "c.md").read_text()


def test_sinks_per_query_row_are_served():
    """Inkling 2 passes ``sinks=`` of one logit per head and query row ([B, H, T, 1], computed
    from the hidden states) where GPT-OSS passes ``s_aux`` per head; both equal eager."""
    verdicts = census(["inkling2_text", "gpt_oss"])
    assert [(v.verdict, v.weights) for v in verdicts] == [("served", 0.0), ("served", 0.0)], verdicts


def test_gemma3_is_tried_as_its_checkpoints_are_built():
    """Gemma 3's config class builds a SigLIP pooling head (an nn.MultiheadAttention, which
    attach refuses) that its checkpoints do not have (vision_use_head false): the census tries
    the real layout, served, with the image tokens' token types as the processor gives them."""
    verdict, = census(["gemma3"])
    assert verdict.verdict == "served" and verdict.kind == "vision-language", verdict
