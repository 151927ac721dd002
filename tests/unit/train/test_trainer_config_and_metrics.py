import json

import pytest
import torch

from attnlab.train import MetricsLogger, TensorBoardLogger, accuracy_and_f1
from attnlab.train.callbacks import tensorboard_available
from attnlab.train.run_config import RunConfig, parse_override


def test_accuracy_and_macro_f1_match_scikit_learn():
    metrics = pytest.importorskip("sklearn.metrics")
    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 3, (200,), generator=generator)
    predictions = torch.where(torch.rand(200, generator=generator) < 0.6, labels, torch.randint(0, 3, (200,), generator=generator))
    result = accuracy_and_f1(predictions, labels, 3)
    assert result["accuracy"] == pytest.approx(metrics.accuracy_score(labels, predictions))
    assert result["f1"] == pytest.approx(metrics.f1_score(labels, predictions, average="macro"))


def test_run_config_from_toml_and_overrides(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[model]\nd_model = 32\nnum_heads = 2\n[train]\nlearning_rate = 1e-4\n')
    config = RunConfig.from_toml(path).with_overrides(["train.epochs=2", "max_length=32"])
    assert (config.model.d_model, config.train.learning_rate, config.train.epochs) == (32, 1e-4, 2)
    assert config.data.max_length == 32
    assert RunConfig.from_dict(config.to_dict()) == config
    # sizes beside a pretrained checkpoint would be ignored (and recorded in config.json): refused
    with pytest.raises(ValueError, match=r"model.d_model=32 has no effect beside model.pretrained='minilm'"):
        config.with_overrides(["model.pretrained=minilm"])
    pretrained = RunConfig().with_overrides(["model.pretrained=minilm", "model.dropout=0.2", "max_length=32"])
    assert pretrained.model.pretrained == "minilm" and RunConfig.from_dict(pretrained.to_dict()) == pretrained
    assert parse_override("data.labels=['neg', 'pos']") == ("data", "labels", ["neg", "pos"])
    assert parse_override("train.max_steps=none") == ("train", "max_steps", None)
    assert parse_override("data.path=my file.csv") == ("data", "path", "my file.csv")


@pytest.mark.parametrize("values, message", [
    ({"modle": {}}, "unknown config sections"),
    ({"model": {"layers": 2}}, "unknown config key model.layers"),
    ({"model": {"d_model": 30, "num_heads": 4}}, "not divisible"),
    ({"train": {"precision": "fp8"}}, "train.precision must be one of"),
    ({"train": {"learning_rate": "fast"}}, "train.learning_rate must be float"),
    ({"model": {"pooling": "max"}}, "model.pooling must be one of"),
])
def test_run_config_errors_name_the_key(values, message):
    with pytest.raises(ValueError, match=message):
        RunConfig.from_dict(values)


def test_invalid_toml_is_reported(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("[model\n")
    with pytest.raises(ValueError, match="invalid TOML"):
        RunConfig.from_toml(path)


def test_metrics_logger_appends_and_skips_steps_it_already_holds(tmp_path):
    path = tmp_path / "metrics.jsonl"
    logger = MetricsLogger(path)
    for step in range(1, 6):
        logger.write({"step": step, "split": "train", "loss": float("nan") if step == 5 else 1.0 / step})
    logger.write({"step": 4, "split": "validation", "accuracy": float("inf")})
    before = path.read_bytes()
    resumed = MetricsLogger(path)
    resumed.open(resuming=True)  # the run resumes from step 3: steps 4 and 5 run again
    for step in range(4, 8):
        resumed.write({"step": step, "split": "train", "loss": 1.0 / step})
    resumed.write({"step": 4, "split": "validation", "accuracy": 0.5})
    resumed.write({"step": 6, "split": "validation", "accuracy": 0.5})
    assert path.read_bytes().startswith(before)  # never rewritten, only appended to
    records = [json.loads(line, parse_constant=pytest.fail) for line in path.read_text().splitlines()]
    appended = [(4, "validation"), (6, "train"), (7, "train"), (6, "validation")]
    assert [(r["step"], r["split"]) for r in records] == [(step, "train") for step in range(1, 6)] + appended
    assert records[4]["loss"] is None and records[5]["accuracy"] is None  # strict JSON: no NaN, no Infinity


def test_metrics_logger_drops_only_a_torn_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "split": "train", "loss": 1.0}\n{"step": 2, "spl')
    logger = MetricsLogger(path)
    logger.open(resuming=True)
    logger.write({"step": 2, "split": "train", "loss": 0.5})
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2]


def test_tensorboard_logger_names_the_extra(tmp_path, monkeypatch):
    import attnlab.train.callbacks as callbacks

    monkeypatch.setattr(callbacks, "tensorboard_available", lambda: False)
    with pytest.raises(ImportError, match=r"attnlab\[tensorboard\]"):
        TensorBoardLogger(tmp_path)


@pytest.mark.skipif(not tensorboard_available(), reason="the tensorboard extra is not installed")
def test_tensorboard_event_files_are_written(tmp_path, dataset, make_model):
    from attnlab.data import PaddingCollator
    from attnlab.train import TransformerTrainer

    trainer = TransformerTrainer(make_model(0.0), 1e-3, 0, output_dir=tmp_path, quiet=True)
    trainer.fit(dataset, dataset, collate_fn=PaddingCollator(0), batch_size=24, epochs=1)
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_a_pretrained_encoder_brings_the_fine_tuning_recipe_which_settings_still_override():
    from attnlab.train.run_config import FINE_TUNING_DEFAULTS, RunConfig, resolve_run_config

    scratch = resolve_run_config(None, [])
    tuned = resolve_run_config(None, ["model.pretrained=minilm"])  # width 384: a compact encoder
    assert scratch.train.learning_rate == RunConfig().train.learning_rate
    assert tuned.train.learning_rate == 1e-4 and tuned.train.epochs == 3 and tuned.train.warmup_steps == 100
    assert "train.learning_rate=5e-5" in FINE_TUNING_DEFAULTS
    assert resolve_run_config(None, ["model.pretrained=minilm", "train.epochs=1"]).train.epochs == 1
    assert resolve_run_config(None, ["model.pretrained=minilm", "train.learning_rate=2e-5"]).train.learning_rate == 2e-5


def test_the_fine_tuning_rate_follows_the_encoder_width(tmp_path):
    import json

    from attnlab.train.run_config import resolve_run_config

    def rate_for(config: dict) -> float:
        directory = tmp_path / str(len(list(tmp_path.iterdir())))
        directory.mkdir()
        (directory / "config.json").write_text(json.dumps(config))
        return resolve_run_config(None, [f'model.pretrained="{directory}"']).train.learning_rate

    assert rate_for({"model_type": "bert", "hidden_size": 768}) == 5e-5  # BERT-base
    assert rate_for({"model_type": "distilbert", "dim": 768}) == 5e-5
    assert rate_for({"model_type": "electra", "hidden_size": 256}) == 1e-4  # ELECTRA-small
    assert rate_for({"model_type": "encoder_classifier", "encoder": {"d_model": 128}}) == 1e-4
    assert rate_for({"model_type": "bert"}) == 5e-5  # width unknown: the general recipe
    # A missing directory keeps the general recipe here; the loader names the problem later.
    assert resolve_run_config(None, ['model.pretrained="no/such/dir"']).train.learning_rate == 5e-5


def test_checkpoint_cadence_is_a_setting_and_rates_must_be_finite():
    import pytest

    from attnlab.train.run_config import resolve_run_config

    config = resolve_run_config(None, ["train.save_every_minutes=5", "train.keep_checkpoints=2"])
    assert config.train.save_every_minutes == 5 and config.train.keep_checkpoints == 2
    assert resolve_run_config(None, ["train.save_every_minutes=none"]).train.save_every_minutes is None
    for bad in ("train.learning_rate=inf", "train.learning_rate=nan", "train.save_every_minutes=0"):
        with pytest.raises(ValueError, match="must be"):
            resolve_run_config(None, [bad])


def test_a_pretrained_run_records_the_checkpoints_architecture_and_resumes(tmp_path):
    # Regression: config.json said d_model 128, num_layers 2 (the defaults) for a run started
    # from a checkpoint of width 24 and 3 layers.
    from attnlab import TransformerEncoder
    from attnlab.cli import main
    from attnlab.data import Tokenizer, train_tokenizer
    from attnlab.models.pretrained import bert_style_config

    texts = ["a fine film", "dull and long", "great fun", "not very good", "the plot is thin"] * 8
    tokenizer = Tokenizer(train_tokenizer(texts, vocab_size=60, kind="wordpiece"))
    torch.manual_seed(0)
    encoder = TransformerEncoder.from_config(bert_style_config(tokenizer.vocab_size, 24, 3, 2, 40, max_len=32,
                                                               pad_id=tokenizer.pad_token_id))
    encoder.save_pretrained(tmp_path / "checkpoint", tokenizer=tokenizer, layout="huggingface")
    data = tmp_path / "reviews.csv"
    data.write_text("text,label\n" + "".join(f"{text},{index % 2}\n" for index, text in enumerate(texts)))
    out = tmp_path / "run"
    common = ["--data", str(data), "--quiet", "--set", f"model.pretrained={json.dumps(str(tmp_path / 'checkpoint'))}",
              "--set", "data.max_length=16"]
    assert main(["train", "--out", str(out), *common, "--set", "train.max_steps=1"]) == 0
    recorded = json.loads((out / "config.json").read_text())["model"]
    assert {key: recorded[key] for key in ("d_model", "num_layers", "num_heads", "d_ff", "position", "norm_first")} == {
        "d_model": 24, "num_layers": 3, "num_heads": 2, "d_ff": 40, "position": "learned", "norm_first": False}
    assert RunConfig.from_json(out / "config.json").model.pretrained == str(tmp_path / "checkpoint")
    assert main(["train", "--out", str(out), "--resume", "--quiet"]) == 0  # the recorded sizes are accepted
