"""The explorer's JSON API on a real server: every view equals what the library computes."""

from __future__ import annotations

import base64

import numpy as np
import pytest
import torch

from attnlab.inspect.commands.explain_text import explain
from attnlab.inspect.compute.capture import capture_attention
from attnlab.inspect.compute.heads import mask_heads
from attnlab.inspect.compute.patching import patch_heads
from attnlab.serve.limits import ServeLimits

from conftest import serve, tiny_decoder, word_tokenizer

TEXT = "the cat sat on the mat . the cat sat on the"


def _unpack(packed: str, shape) -> np.ndarray:
    return np.frombuffer(base64.b64decode(packed), dtype="<u2").astype(np.float64).reshape(shape) / 65535


def _ids(tokenizer, text: str) -> torch.Tensor:
    return torch.tensor([tokenizer.encode(text).ids])


def test_info_names_the_model_its_layers_and_heads(decoder_server) -> None:
    server, _ = decoder_server
    status, info = server.request("api/info")
    assert status == 200
    assert (info["kind"], info["layers"], info["heads"]) == ("decoder", 2, [4, 4])
    assert "occlusion" in info["methods"] and info["can_patch"]


def test_switching_a_head_off_gives_the_library_head_masks_prediction(decoder_server) -> None:
    server, session = decoder_server
    model, tokenizer = session.explorer.model, session.explorer.tokenizer
    status, clean = server.request("api/view", {"text": TEXT, "off": []})
    assert status == 200
    status, masked = server.request("api/view", {"text": TEXT, "off": ["2:1", "1:3"],
                                                 "track": [t["id"] for t in clean["prediction"]["top"]]})
    assert status == 200 and masked["off"] == ["1:3", "2:1"]
    ids = _ids(tokenizer, TEXT)
    with torch.no_grad():
        expected_clean = torch.softmax(model(ids).logits[0, -1], -1)
        with mask_heads(model, {"layer_1": [2], "layer_2": [0]}):
            expected = torch.softmax(model(ids).logits[0, -1], -1)
    # the explorer asks for the weights (the reference kernel); the plain call runs the fused one
    for top, reference in ((clean, expected_clean), (masked, expected)):
        for entry in top["prediction"]["top"]:
            assert entry["probability"] == pytest.approx(float(reference[entry["id"]]), abs=2e-5)
    for token, probability in masked["prediction"]["tracked"].items():
        assert probability == pytest.approx(float(expected[int(token)]), abs=2e-5)
    assert not torch.allclose(expected, expected_clean)  # the switch-off moves the prediction
    # statistics: a layers x heads table per statistic, the decoder's roles among them
    assert {"normalized_entropy", "sink_mass", "previous-token", "induction"} <= set(clean["statistics"])
    assert np.array(clean["statistics"]["induction"], dtype=float).shape == (2, 4)


def test_a_heads_map_is_the_captured_map_whole_pooled_or_by_rows(decoder_server) -> None:
    server, session = decoder_server
    model, tokenizer = session.explorer.model, session.explorer.tokenizer
    with torch.no_grad(), capture_attention(model) as captured:
        model(_ids(tokenizer, TEXT))
    weights = captured.attentions["layer_2"][0, 2].double().numpy()  # [T, T]
    status, whole = server.request("api/map", {"text": TEXT, "layer": 2, "head": 3})
    assert status == 200 and whole["kind"] == "full"
    np.testing.assert_allclose(_unpack(whole["weights"], whole["shape"]), weights, atol=1e-3)  # float16 kept
    status, rows = server.request("api/map", {"text": TEXT, "layer": 2, "head": 3, "rows": [4, 7]})
    assert status == 200 and rows["kind"] == "rows" and rows["shape"] == [3, 12]
    np.testing.assert_allclose(_unpack(rows["weights"], rows["shape"]), weights[4:7], atol=1e-3)
    status, mean = server.request("api/map", {"text": TEXT, "layer": 2, "head": "mean"})
    assert status == 200
    heads = captured.attentions["layer_2"][0].double().mean(0).numpy()
    np.testing.assert_allclose(_unpack(mean["weights"], mean["shape"]), heads, atol=1e-3)


def test_a_long_texts_map_is_pooled_into_block_means() -> None:
    limits = ServeLimits(max_tokens=64, max_new_tokens=4, map_cells=5)
    server, session = serve(tiny_decoder(), word_tokenizer(), limits=limits)
    try:
        status, pooled = server.request("api/map", {"text": TEXT, "layer": 1, "head": 1})
        assert status == 200 and pooled["kind"] == "pooled" and pooled["shape"] == [5, 5]
        with torch.no_grad(), capture_attention(session.explorer.model) as captured:
            session.explorer.model(_ids(session.explorer.tokenizer, TEXT))
        weights = captured.attentions["layer_1"][0, 0].double().numpy()
        r, c = pooled["row_edges"], pooled["col_edges"]
        expected = [[weights[r[i]:r[i + 1], c[j]:c[j + 1]].mean() for j in range(5)] for i in range(5)]
        np.testing.assert_allclose(_unpack(pooled["weights"], [5, 5]), expected, atol=1e-3)
        status, too_many = server.request("api/map", {"text": TEXT, "layer": 1, "head": 1, "rows": [0, 6]})
        assert status == 422 and "at most 5" in too_many["error"]
    finally:
        server.stop()


def test_steps_follow_greedy_generation_and_show_the_last_positions_row(decoder_server) -> None:
    server, session = decoder_server
    model, tokenizer = session.explorer.model, session.explorer.tokenizer
    generated = []
    for _ in range(3):
        status, step = server.request("api/step", {"text": "the cat sat", "generated": generated})
        assert status == 200
        generated.append(step["id"])
    expected = model.generate(_ids(tokenizer, "the cat sat"), max_new_tokens=3).sequences[0, 3:].tolist()
    assert generated == expected
    with torch.no_grad(), capture_attention(model) as captured:
        model(torch.tensor([tokenizer.encode("the cat sat").ids + generated[:2]]))
    rows = _unpack(step["attended"], step["shape"])  # [L, H, S]
    np.testing.assert_allclose(rows[1, 3], captured.attentions["layer_2"][0, 3, -1].numpy(), atol=1e-3)


def test_explain_gives_the_librarys_scores(classifier_server) -> None:
    server, session = classifier_server
    status, answer = server.request("api/explain", {"text": "the film was great fun", "method": "grad-attention"})
    assert status == 200
    reference = explain(session.explorer.model, session.explorer.tokenizer, "the film was great fun",
                        ["grad-attention"])
    assert answer["tokens"] == reference.tokens
    np.testing.assert_allclose(answer["scores"], reference.scores["grad-attention"], rtol=1e-5, atol=1e-7)
    assert "explained class" in answer["explained"]
    # with heads off, the scores are those of the model with those heads masked
    method = "integrated-gradients"
    status, answer = server.request("api/explain", {"text": "the film was great fun", "method": method,
                                                    "off": ["1:2"]})
    assert status == 200, answer
    assert answer["off"] == ["1:2"] and "1 head(s) off" in answer["explained"]
    model, tokenizer = session.explorer.model, session.explorer.tokenizer
    with mask_heads(model, {"layer_1": [1]}):
        masked = explain(model, tokenizer, "the film was great fun", [method])
    np.testing.assert_allclose(answer["scores"], masked.scores[method], rtol=1e-5, atol=1e-7)
    assert not np.allclose(masked.scores[method], explain(model, tokenizer, "the film was great fun",
                                                          [method]).scores[method])
    # grad-attention reads gradients through the weights a head mask cuts from the output: refused, said why
    status, answer = server.request("api/explain", {"text": "the film was great fun", "method": "grad-attention",
                                                    "off": ["1:2"]})
    assert status == 422 and "does not explain the model with heads off" in answer["error"]


def test_patch_gives_the_library_patchings_logits(classifier_server) -> None:
    server, session = classifier_server
    text, source = "the film was great fun", "the film was very bad"
    status, answer = server.request("api/patch", {"text": text, "source": source, "heads": ["1:2", "2:4"]})
    assert status == 200
    tokenizer = session.explorer.tokenizer
    reference = patch_heads(session.explorer.model, _ids(tokenizer, source), _ids(tokenizer, text),
                            {"layer_1": [1], "layer_2": [3]})
    assert answer["label"] == ["negative", "positive"][reference.label]
    for name in ("clean", "source", "patched"):
        assert answer[name] == pytest.approx(float(getattr(reference, name)[0]), abs=1e-5)


def test_a_classifier_shows_every_labels_probability(classifier_server) -> None:
    server, session = classifier_server
    status, view = server.request("api/view", {"text": "the film was great fun", "off": ["1:1"]})
    assert status == 200
    with torch.no_grad(), mask_heads(session.explorer.model, {"layer_1": [0]}):
        expected = torch.softmax(session.explorer.model(_ids(session.explorer.tokenizer,
                                                             "the film was great fun")).logits[0], -1)
    assert [entry["token"] for entry in view["prediction"]["top"]] == ["negative", "positive"]
    np.testing.assert_allclose([entry["probability"] for entry in view["prediction"]["top"]], expected, atol=2e-5)
