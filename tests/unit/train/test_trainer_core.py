import pytest
import torch
from torch import nn

from attnlab.data import PaddingCollator
from attnlab.train import TransformerTrainer, decay_parameter_groups

COLLATE = PaddingCollator(0)


def batch_of(dataset, indices):
    return COLLATE([dataset[i] for i in indices])


def test_articles_train_step_with_inputs_targets_and_criterion(dataset, make_model):
    model = make_model(0.0)
    trainer = TransformerTrainer(model, 1e-3, 2, total_steps=10)
    batch = batch_of(dataset, range(8))
    inputs, targets = batch["input_ids"], batch["labels"]
    loss = trainer.train_step((inputs, targets), nn.CrossEntropyLoss())
    assert isinstance(loss, float) and loss > 0
    assert trainer.state.step == 1 and trainer.scheduler.get_last_lr()[0] == pytest.approx(0.5e-3)
    # a dict batch uses the task head's own loss; the same loss as criterion on logits
    model.eval()
    with torch.no_grad():
        out = model(**batch)
        torch.testing.assert_close(out.loss, nn.CrossEntropyLoss()(out.logits, batch["labels"]))


def test_gradients_are_clipped(dataset, make_model):
    model = make_model(0.0)
    with torch.no_grad():
        model.classifier.weight.mul_(1e4)  # huge gradients
    trainer = TransformerTrainer(model, 1e-3, 0, total_steps=10, grad_clip=1.0)
    trainer.train_step(batch_of(dataset, range(8)))
    clipped = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None]))
    assert trainer.last_log["grad_norm"] > 10
    assert clipped.item() == pytest.approx(1.0, rel=1e-4)
    unclipped = TransformerTrainer(make_model(0.0), 1e-3, 0, total_steps=10, grad_clip=None)
    unclipped.train_step(batch_of(dataset, range(8)))
    assert "grad_norm" not in unclipped.last_log


def _without_key_bias(model):
    # The key bias gets a gradient of exactly zero in theory (softmax ignores a constant
    # added to every score of a row), so only rounding noise; Adam with eps=1e-9 turns
    # that noise into full-size steps. It cannot change any output, so it is left out.
    E = model.encoder.config.d_model
    return torch.cat([
        (p.detach()[torch.arange(p.shape[0]) // E != 1] if name.endswith("in_proj_bias") else p.detach()).flatten()
        for name, p in model.named_parameters()
    ])


def test_accumulation_equals_the_big_batch(dataset, make_model):
    params, grads = [], []
    for batch_size, accumulation in ((12, 1), (3, 4), (5, 3)):
        model = make_model(0.0)
        trainer = TransformerTrainer(model, 1e-2, 1, gradient_accumulation_steps=accumulation, grad_clip=None,
                                     quiet=True)
        if batch_size == 5:  # the same 12 items per step, split unevenly into 5 + 5 + 2
            original = trainer._chunks

            def chunks(items, size):
                if size == 5:
                    return [part for step in original(items, 12) for part in original(step, 5)]
                return original(items, size)
            trainer._chunks = chunks
        trainer.add_callback("on_step_end", lambda t: t.state.step == 1 and grads.append(
            torch.cat([p.grad.flatten().clone() for p in t.model.parameters()])))
        trainer.fit(dataset, collate_fn=COLLATE, batch_size=batch_size, epochs=None, max_steps=3)
        assert trainer.state.step == 3
        params.append(_without_key_bias(model))
    for index in (1, 2):
        torch.testing.assert_close(grads[index], grads[0], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(params[index], params[0], atol=1e-5, rtol=1e-5)


def test_weight_decay_skips_biases_norms_and_embeddings(make_model):
    model = make_model(0.1)
    decay, keep = decay_parameter_groups(model, 0.1)
    names = {id(p): name for name, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    kept = {names[id(p)] for p in keep["params"]}
    assert "encoder.layers.0.self_attn.in_proj_weight" in decayed and "classifier.weight" in decayed
    assert "encoder.embedding.weight" in kept and "encoder.layers.0.norm1.weight" in kept
    assert all(not name.endswith("bias") for name in decayed)
    assert keep["weight_decay"] == 0.0 and decay["weight_decay"] == 0.1
    assert len(decayed) + len(kept) == len(list(model.parameters()))


def test_bf16_autocast_on_cpu(dataset, make_model):
    trainer = TransformerTrainer(make_model(0.0), 1e-3, 0, total_steps=4, precision="bf16")
    assert torch.isfinite(torch.tensor(trainer.train_step(batch_of(dataset, range(8)))))
    result = trainer.evaluate(dataset, collate_fn=COLLATE, batch_size=16)
    assert set(result) == {"loss", "accuracy", "f1"}
    with pytest.raises(ValueError, match="fp16"):
        TransformerTrainer(make_model(0.0), precision="fp16")


@pytest.mark.parametrize("native", [True, False])
def test_bf16_on_a_cpu_without_native_bf16_warns(make_model, monkeypatch, caplog, native):
    import attnlab.train.trainer as trainer_module

    monkeypatch.setattr(trainer_module, "cpu_has_native_bf16", lambda: native)
    with caplog.at_level("WARNING", logger="attnlab.train.trainer"):
        TransformerTrainer(make_model(0.0), precision="bf16")
        TransformerTrainer(make_model(0.0), precision="fp32")
    warnings = [record.getMessage() for record in caplog.records if "bfloat16" in record.getMessage()]
    assert len(warnings) == (0 if native else 1)
    assert native or "layers not from attnlab" in warnings[0]


def test_callbacks_on_named_events(dataset, make_model):
    seen = []

    class Recorder:
        def on_fit_start(self, trainer):
            seen.append("fit_start")

        def on_epoch_end(self, trainer):
            seen.append(f"epoch_end {trainer.state.epoch}")

        def on_fit_end(self, trainer):
            seen.append("fit_end")

    trainer = TransformerTrainer(make_model(0.0), 1e-3, 0, callbacks=[Recorder()], quiet=True)
    trainer.add_callback("on_step_end", lambda t: seen.append(f"step {t.state.step}"))
    trainer.add_callback("on_evaluate", lambda t: seen.append(f"eval {t.last_log['accuracy']:.2f}"))
    trainer.fit(dataset, dataset, collate_fn=COLLATE, batch_size=24, epochs=2)
    assert seen[0] == "fit_start" and seen[-1] == "fit_end"
    assert [item for item in seen if item.startswith(("step", "epoch"))] == [
        "step 1", "step 2", "epoch_end 1", "step 3", "step 4", "epoch_end 2"]
    assert sum(item.startswith("eval") for item in seen) == 2
    with pytest.raises(ValueError, match="unknown event"):
        trainer.add_callback("on_nothing", print)


def test_early_stopping_and_best_checkpoint(tmp_path, dataset, make_model, monkeypatch):
    trainer = TransformerTrainer(make_model(0.0), 1e-3, 0, output_dir=tmp_path, quiet=True)
    scores = iter([0.5, 0.7, 0.6, 0.65, 0.9])
    monkeypatch.setattr(trainer, "evaluate", lambda *a, **k: {"loss": 1.0, "accuracy": next(scores), "f1": 0.0})
    state = trainer.fit(dataset, dataset, collate_fn=COLLATE, batch_size=8, epochs=None, max_steps=20,
                        eval_every=2, early_stopping_patience=2)
    assert state.should_stop and state.step == 8
    assert state.best_metric == 0.7 and state.best_step == 4
    best = torch.load(tmp_path / "checkpoints" / "best" / "trainer_state.pt", weights_only=True)
    assert best["trainer"]["step"] == 4
    last = torch.load(tmp_path / "checkpoints" / "last" / "trainer_state.pt", weights_only=True)
    assert last["trainer"]["step"] == 8
    assert (tmp_path / "metrics.jsonl").is_file()


def test_progress_bar_is_quiet_without_a_terminal(dataset, make_model, capsys):
    trainer = TransformerTrainer(make_model(0.0), 1e-3, 0)
    trainer.fit(dataset, collate_fn=COLLATE, batch_size=24, epochs=1)
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


def test_visualize_attention_is_headless_eval_mode_and_restores_mode(tmp_path, make_model, monkeypatch):
    import matplotlib.pyplot as plt

    monkeypatch.setattr(plt, "show", lambda *a, **k: pytest.fail("plt.show() must not be called"))
    model = make_model(0.5)  # heavy dropout: train-mode weights would differ run to run
    trainer = TransformerTrainer(model, total_steps=10)
    model.train()
    ids = torch.tensor([[1, 5, 6, 7, 2, 0, 0]])
    first = trainer.visualize_attention(ids, layer_idx=1, head_idx=1, path=tmp_path / "map.png")
    assert model.training  # restored
    second = trainer.visualize_attention(ids[0], layer_idx=1, head_idx=1)
    assert first.shape == (5, 5)  # cut to the real tokens
    assert (first == second).all()
    assert abs(first.sum(-1) - 1).max() < 1e-5
    assert (tmp_path / "map.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    model.eval()
    trainer.visualize_attention(ids)
    assert not model.training
    with pytest.raises(ValueError, match="layer_idx=5"):
        trainer.visualize_attention(ids, layer_idx=5)
    with pytest.raises(ValueError, match="head_idx=2"):
        trainer.visualize_attention(ids, head_idx=2)


def test_masked_lm_training_and_evaluation(dataset):
    from attnlab.data import MaskedLMCollator, TokenizedDataset
    from attnlab.models import TransformerEncoder
    from attnlab.models import EncoderForMaskedLM

    torch.manual_seed(0)
    model = EncoderForMaskedLM(TransformerEncoder(30, d_model=16, num_layers=1, num_heads=2, d_ff=32, pad_id=0))
    texts = TokenizedDataset(dataset.input_ids)
    collate = MaskedLMCollator(0, 4, 30, [0, 1, 2, 4], probability=0.3)
    trainer = TransformerTrainer(model, 3e-3, 2, quiet=True)
    before = trainer.evaluate(texts, collate_fn=collate)
    trainer.fit(texts, collate_fn=collate, batch_size=8, epochs=3)
    after = trainer.evaluate(texts, collate_fn=collate)
    assert after["loss"] < before["loss"] and 0.0 <= after["accuracy"] <= 1.0


def test_pictures_number_layers_and_heads_from_1_and_label_tokens(tmp_path, make_model) -> None:
    from attnlab.train.visualize import attention_figure, map_title

    assert map_title(0, 0) == "Layer 1, head 1" and map_title(1, 2, "a text") == "Layer 2, head 3: a text"
    model = make_model(0.0)
    trainer = TransformerTrainer(model, total_steps=10)
    ids = torch.tensor([[1, 5, 6, 7, 2, 0, 0]])
    tokens = ["[CLS]", "a", "b", "c", "[SEP]"]
    attn = trainer.visualize_attention(ids, layer_idx=1, head_idx=0, path=tmp_path / "map.png", tokens=tokens)
    figure = attention_figure(attn, title=map_title(1, 0), tokens=tokens)
    axes = figure.axes[0]
    assert axes.get_title() == "Layer 2, head 1"
    assert [label.get_text() for label in axes.get_xticklabels()] == tokens
    assert [label.get_text() for label in axes.get_yticklabels()] == tokens
    with pytest.raises(ValueError, match="tokens has 2 entries for a 5 x 5 map"):
        attention_figure(attn, tokens=tokens[:2])


def test_dict_batches_with_huggingfaces_attention_mask_train_like_attnlabs_mask(dataset, make_model) -> None:
    """A collator that names the padding mask ``attention_mask`` (HF's name, here as 0/1 floats)."""

    def hf_collate(items):
        batch = COLLATE(items)
        return {"input_ids": batch["input_ids"], "attention_mask": batch.pop("mask").float(), "labels": batch["labels"]}

    losses = []
    for collate in (COLLATE, hf_collate):
        torch.manual_seed(0)
        trainer = TransformerTrainer(make_model(0.0), 1e-3, 2, quiet=True)
        trainer.fit(dataset, collate_fn=collate, batch_size=8, epochs=1)
        losses.append(trainer.evaluate(dataset, collate_fn=collate)["loss"])
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)
