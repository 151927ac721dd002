"""The configuration of an ``attnlab train`` run: three shared, validated sections and
the sections of the run's task.

Read from TOML (``[model]``, ``[data]``, ``[train]`` tables, and a task's own such as
``[image]``), changed with
``section.key=value`` overrides, written next to the run as ``config.json``.
The defaults are the demonstration run: a small encoder trained from scratch on the
embedded Rotten Tomatoes snippets, within a few minutes on two CPU cores.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

from ..data.tokenization import SPECIAL_TOKENS
from ..layers.encoder_config import POSITIONS
from ..models.classifier import POOLINGS
from ..checkpoints.source import pretrained_width
from .tasks import DEFAULT_TASK, get_task, task_names
from .trainer import METRICS, PRECISIONS

__all__ = [
    "ModelSettings", "DataSettings", "TrainSettings", "RunConfig", "parse_override", "resolve_run_config",
    "task_sections", "check_choice", "FINE_TUNING_DEFAULTS", "fine_tuning_defaults", "ARCHITECTURE_FIELDS",
]


@dataclass
class ModelSettings:
    """The classifier. ``pretrained`` names a checkpoint to start from: its architecture
    and tokenizer are used, so the architecture fields (:data:`ARCHITECTURE_FIELDS`) may not
    be set beside it (a config that sets one is refused, rather than record sizes the model
    does not have); dropouts and pooling still apply."""

    pretrained: Optional[str] = None
    d_model: int = 128
    num_layers: int = 2
    num_heads: int = 4
    d_ff: int = 256
    dropout: float = 0.1
    attention_dropout: float = 0.0  # 0 keeps the fused attention kernel in training
    position: str = "sinusoidal"
    norm_first: bool = True  # pre-norm trains stably at the higher rates a small model wants
    pooling: str = "mean"  # masked mean: every token's evidence counts, not one [CLS] slot
    classifier_dropout: float = 0.1

    def __post_init__(self) -> None:
        for name in ("d_model", "num_layers", "num_heads", "d_ff"):
            _positive(f"model.{name}", getattr(self, name))
        for name in ("dropout", "attention_dropout", "classifier_dropout"):
            _probability(f"model.{name}", getattr(self, name))
        check_choice("model.position", self.position, POSITIONS)
        check_choice("model.pooling", self.pooling, POOLINGS)
        if self.d_model % self.num_heads:
            raise ValueError(f"model.d_model={self.d_model} is not divisible by model.num_heads={self.num_heads}")


# what a pretrained checkpoint decides (model.pretrained); the other [model] fields apply to it too
ARCHITECTURE_FIELDS = ("d_model", "num_layers", "num_heads", "d_ff", "position", "norm_first")


@dataclass
class DataSettings:
    """Where the examples come from and how they become token ids."""

    task: str = DEFAULT_TASK  # what kind of run (see attnlab.train.tasks); e.g. "digits-text"
    dataset: str = "rotten_tomatoes"  # the embedded data set, unless `path` is set
    path: Optional[str] = None  # your own CSV / JSONL file
    format: Optional[str] = None  # "csv" | "jsonl"; None: from the file suffix
    text_column: str = "text"
    label_column: str = "label"
    labels: Optional[list[str]] = None  # allowed labels in id order; None: those in the file
    split_seed: int = 0
    validation_fraction: float = 0.1
    test_fraction: float = 0.1
    tokenizer: str = "wordpiece"  # "wordpiece" | "bpe" (trained on the train split) | a tokenizer.json
    vocab_size: int = 8000
    min_frequency: int = 2
    lowercase: bool = True
    max_length: int = 64  # tokens per text, [CLS] and [SEP] included
    train_limit: Optional[int] = None  # use only the first N training examples (quick runs)

    def __post_init__(self) -> None:
        check_choice("data.task", self.task, task_names())
        if self.path is None and self.dataset != "rotten_tomatoes":
            raise ValueError(f"data.dataset must be 'rotten_tomatoes' (or set data.path), got {self.dataset!r}")
        for name in ("vocab_size", "max_length", "min_frequency"):
            _positive(f"data.{name}", getattr(self, name))
        if self.vocab_size <= len(SPECIAL_TOKENS):
            raise ValueError(f"data.vocab_size must exceed {len(SPECIAL_TOKENS)} (the special tokens "
                             f"{', '.join(SPECIAL_TOKENS)}), got {self.vocab_size}")
        if self.train_limit is not None:
            _positive("data.train_limit", self.train_limit)
        if self.max_length < 2:
            raise ValueError(f"data.max_length must be >= 2, got {self.max_length}")
        for name, use in (("validation_fraction", "picks the best checkpoint at every evaluation"),
                          ("test_fraction", "gives the final test report")):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
                raise ValueError(f"data.{name} must lie strictly between 0 and 1 (its split {use}), "
                                 f"got {value!r}")
        if self.validation_fraction + self.test_fraction >= 1:
            raise ValueError(f"data.validation_fraction + data.test_fraction must be < 1 to leave training examples, "
                             f"got {self.validation_fraction} + {self.test_fraction}")


@dataclass
class TrainSettings:
    """The optimisation. ``batch_size`` is per process and per accumulation step."""

    seed: int = 0
    epochs: int = 8
    max_steps: Optional[int] = None
    batch_size: int = 32
    gradient_accumulation_steps: int = 1
    learning_rate: float = 1e-3
    warmup_steps: int = 200
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.01
    grad_clip: Optional[float] = 1.0
    precision: str = "fp32"
    eval_every: Optional[int] = None  # steps; None: after every epoch
    metric: str = "accuracy"
    early_stopping_patience: Optional[int] = None
    save_every: Optional[int] = None  # steps; checkpoints/last is always written at the end
    save_every_minutes: Optional[float] = 1.0  # a resumable checkpoint this often: a kill loses at most that
    keep_checkpoints: int = 3  # checkpoints/last and the versions before it (last.1, ...), for a damaged save
    log_every: int = 10
    eval_batch_size: int = 256
    mlm_steps: int = 0  # masked-LM pre-training steps on the training texts, before classifying
    mlm_learning_rate: float = 1e-3
    mlm_probability: float = 0.15
    num_threads: Optional[int] = None  # torch's CPU threads per process; None: torch's default

    def __post_init__(self) -> None:
        if self.save_every_minutes is not None and (
            not isinstance(self.save_every_minutes, (int, float)) or not 0 < self.save_every_minutes < math.inf
        ):
            raise ValueError(f"train.save_every_minutes must be > 0 or none, got {self.save_every_minutes!r}")
        for name in ("epochs", "batch_size", "gradient_accumulation_steps", "log_every", "eval_batch_size",
                     "keep_checkpoints"):
            _positive(f"train.{name}", getattr(self, name))
        for name in ("max_steps", "eval_every", "save_every", "early_stopping_patience", "num_threads"):
            if getattr(self, name) is not None:
                _positive(f"train.{name}", getattr(self, name))
        for name in ("learning_rate", "mlm_learning_rate"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < math.inf:
                raise ValueError(f"train.{name} must be a finite number > 0, got {value!r}")
        if self.warmup_steps < 0 or self.mlm_steps < 0:
            raise ValueError("train.warmup_steps and train.mlm_steps must be >= 0")
        check_choice("train.precision", self.precision, PRECISIONS)
        check_choice("train.metric", self.metric, tuple(METRICS))
        _probability("train.mlm_probability", self.mlm_probability)


_SECTIONS = {"model": ModelSettings, "data": DataSettings, "train": TrainSettings}


def task_sections(task: str) -> dict[str, type]:
    """Every config section of a run of ``task``: the shared ones, then the task's own."""
    return {**_SECTIONS, **get_task(task).sections}


@dataclass
class RunConfig:
    """A whole run: the shared ``model``, ``data`` and ``train`` sections, and the sections
    of the task ``data.task`` names (``config.image`` for ``digits-text``).

    A task's unused shared settings must keep their defaults: setting one is refused
    with a ValueError that names it and the task.
    """

    model: ModelSettings = field(default_factory=ModelSettings)
    data: DataSettings = field(default_factory=DataSettings)
    train: TrainSettings = field(default_factory=TrainSettings)
    sections: dict[str, Any] = field(default_factory=dict)  # the task's own, by name

    def __post_init__(self) -> None:
        task = get_task(self.data.task)
        for name, section_cls in task.sections.items():
            given = self.sections.get(name)
            if given is None:
                self.sections[name] = section_cls()
            elif not isinstance(given, section_cls):
                raise TypeError(
                    f"config section [{name}] must be a {section_cls.__name__}, got {type(given).__name__}"
                )
        foreign = sorted(set(self.sections) - set(task.sections))
        if foreign:
            raise ValueError(f"config section [{foreign[0]}] is not used by task {task.name!r}; remove it")
        for setting in task.unused:
            section, key = setting.split(".", 1)
            value = getattr(getattr(self, section), key)
            if value != getattr(_SECTIONS[section](), key):
                raise ValueError(f"{setting}={value!r} is not used by task {task.name!r}; remove it")
        if self.model.pretrained:
            for name in ARCHITECTURE_FIELDS:
                value = getattr(self.model, name)
                if value != getattr(ModelSettings, name):
                    raise ValueError(f"model.{name}={value!r} has no effect beside model.pretrained="
                                     f"{self.model.pretrained!r}: the checkpoint decides the architecture; remove it")

    def __getattr__(self, name: str) -> Any:
        # only called for names not found normally: a task's own section, by name
        sections = self.__dict__.get("sections") or {}
        if name in sections:
            return sections[name]
        data = self.__dict__.get("data")
        task = getattr(data, "task", None)
        raise AttributeError(f"{type(self).__name__} has no section {name!r} (task {task!r})")

    def to_dict(self) -> dict[str, dict[str, Any]]:
        shared = {name: dataclasses.asdict(getattr(self, name)) for name in _SECTIONS}
        return {**shared, **{name: dataclasses.asdict(value) for name, value in self.sections.items()}}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "RunConfig":
        data = values.get("data", {})
        task = data.get("task", DEFAULT_TASK) if isinstance(data, dict) else DEFAULT_TASK
        if not isinstance(task, str) or task not in task_names():
            check_choice("data.task", task, task_names())
        all_sections = task_sections(task)
        unknown = sorted(set(values) - set(all_sections))
        if unknown:
            raise ValueError(
                f"unknown config sections {unknown}; sections of task {task!r}: {sorted(all_sections)}"
            )
        sections = {}
        for name, section_cls in all_sections.items():
            given = values.get(name, {})
            if not isinstance(given, dict):
                raise ValueError(f"config section [{name}] must be a table, got {given!r}")
            sections[name] = section_cls(**_check_types(name, section_cls, given))
        own = {name: sections.pop(name) for name in list(sections) if name not in _SECTIONS}
        return cls(**sections, sections=own)

    @classmethod
    def from_toml(cls, path: Union[str, Path]) -> "RunConfig":
        return cls.from_dict(_read_toml(path))

    @classmethod
    def from_json(cls, path: Union[str, Path]) -> "RunConfig":
        """Read a run's ``config.json``. Runs written before tasks owned their sections
        carry every task's sections; one left at its defaults is dropped, not refused. A
        pretrained run's architecture fields are its checkpoint's, read again from it."""
        values = json.loads(Path(path).read_text(encoding="utf-8"))
        model = values.get("model") if isinstance(values, dict) else None
        if isinstance(model, dict) and model.get("pretrained"):
            # a pretrained run records the checkpoint's architecture (record_pretrained_architecture);
            # the checkpoint decides it again when the run resumes
            values["model"] = {key: value for key, value in model.items() if key not in ARCHITECTURE_FIELDS}
        data = values.get("data") if isinstance(values, dict) else None
        task = data.get("task", DEFAULT_TASK) if isinstance(data, dict) else DEFAULT_TASK
        if isinstance(values, dict) and task in task_names():
            for name in set(values) - set(task_sections(task)):
                if values[name] == _default_section(name):
                    del values[name]
        return cls.from_dict(values)

    def with_overrides(self, overrides: Sequence[str]) -> "RunConfig":
        """A copy with ``section.key=value`` (or unique ``key=value``) overrides applied;
        values are read as TOML (``3e-4``, ``true``, ``"text"``, ``none``), else as strings."""
        values = self.to_dict()
        for override in overrides:
            section, key, value = parse_override(override, task_sections(self.data.task))
            values[section][key] = value
        return RunConfig.from_dict(values)


def _default_section(name: str) -> Optional[dict[str, Any]]:
    """The default values of the section ``name`` of any task, or ``None``."""
    for task in task_names():
        section_cls = get_task(task).sections.get(name)
        if section_cls is not None:
            return dataclasses.asdict(section_cls())
    return None


def _read_toml(path: Union[str, Path]) -> dict[str, Any]:
    """The tables of a TOML config file, with errors that name the file."""
    path = Path(path)
    if not path.is_file():
        problem = "is a directory; name a TOML file" if path.is_dir() else "does not exist"
        raise FileNotFoundError(f"config file {path} {problem}")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"{path}: invalid TOML ({error})") from None


def resolve_run_config(path: Union[str, Path, None] = None, overrides: Sequence[str] = ()) -> RunConfig:
    """The run's config: defaults, then the task's defaults, then the TOML file, then overrides.

    The task (``data.task``) is read from the overrides, else the file, else the default.
    """
    explicit: dict[str, Any] = {}
    if path is not None:
        explicit = _read_toml(path)
    task = explicit.get("data", {}).get("task", DEFAULT_TASK) if isinstance(explicit.get("data"), dict) else DEFAULT_TASK
    for override in overrides:
        key, raw = _split_override(override)
        if key in ("task", "data.task"):
            task = _toml_value(raw)
    if not isinstance(task, str) or task not in task_names():
        check_choice("data.task", task, task_names())
    sections = task_sections(task)
    values = {name: dataclasses.asdict(section_cls()) for name, section_cls in sections.items()}
    values["data"]["task"] = task
    for section, key, value in (parse_override(item, sections) for item in get_task(task).defaults):
        values[section][key] = value
    pretrained = _pretrained_given(explicit, overrides)
    if pretrained:
        for section, key, value in (parse_override(item, sections) for item in fine_tuning_defaults(pretrained)):
            values[section][key] = value
    for section, given in explicit.items():
        if section not in values or not isinstance(given, dict):
            return RunConfig.from_dict(explicit)  # reports the bad section
        values[section].update(given)
    for section, key, value in (parse_override(override, sections) for override in overrides):
        values[section][key] = value
    return RunConfig.from_dict(values)


# Starting from a pretrained encoder (``model.pretrained``) wants a fine-tuning recipe, not
# the from-scratch one: a small learning rate with warm-up over a few epochs (measured on
# MiniLM and the embedded Rotten Tomatoes split: benchmarks/learning.py). The file and
# --set still override each of these.
FINE_TUNING_DEFAULTS = (
    "train.learning_rate=5e-5",
    "train.epochs=3",
    "train.warmup_steps=100",
)
# Compact encoders take a larger step: Turc et al. (2019, "Well-Read Students Learn
# Better") found the best fine-tuning rate of BERTs of width <= 512 at 1e-4 or above, and
# MiniLM (width 384) reaches 0.842 test accuracy on the embedded split at 1e-4 against
# 0.828 at 5e-5 (same seed, 3 epochs).
SMALL_ENCODER_WIDTH = 512
SMALL_ENCODER_FINE_TUNING = ("train.learning_rate=1e-4",)


def fine_tuning_defaults(pretrained: Any) -> tuple[str, ...]:
    """The fine-tuning recipe for the encoder ``model.pretrained`` names (the rate by its width)."""
    width = pretrained_width(pretrained) if isinstance(pretrained, (str, Path)) else None
    if width is not None and width <= SMALL_ENCODER_WIDTH:
        return (*FINE_TUNING_DEFAULTS, *SMALL_ENCODER_FINE_TUNING)
    return FINE_TUNING_DEFAULTS


def _pretrained_given(explicit: dict[str, Any], overrides: Sequence[str]) -> Any:
    """The ``model.pretrained`` value the file or the overrides give (falsy: none)."""
    pretrained = explicit.get("model", {}).get("pretrained") if isinstance(explicit.get("model"), dict) else None
    for override in overrides:
        key, raw = _split_override(override)
        if key == "model.pretrained":
            pretrained = _toml_value(raw)
    return pretrained


def _split_override(override: str) -> tuple[str, str]:
    if "=" not in override:
        raise ValueError(f"--set expects key=value, got {override!r}")
    key, raw = (part.strip() for part in override.split("=", 1))
    return key, raw


def _toml_value(raw: str) -> Any:
    if raw.lower() in ("none", "null"):
        return None
    try:
        return tomllib.loads(f"value = {raw}")["value"]
    except tomllib.TOMLDecodeError:
        return raw


def parse_override(override: str, sections: Optional[Mapping[str, type]] = None) -> tuple[str, str, Any]:
    """``"train.learning_rate=3e-4"`` -> ``("train", "learning_rate", 0.0003)``.

    Args:
        override: ``section.key=value``, or ``key=value`` when one section has ``key``.
        sections: the sections a key may belong to; default the shared ones
            (:func:`task_sections` adds a task's own).
    """
    sections = dict(_SECTIONS if sections is None else sections)
    key, raw = _split_override(override)
    if "." in key:
        section, name = key.split(".", 1)
        if section not in sections:
            raise ValueError(f"unknown config section {section!r} in {override!r}; sections: {sorted(sections)}")
    else:
        owners = [section for section, cls in sections.items() if key in _field_names(cls)]
        if len(owners) != 1:
            raise ValueError(f"unknown config key {key!r}" if not owners else f"ambiguous key {key!r}: use one of "
                             + ", ".join(f"{owner}.{key}" for owner in owners))
        section, name = owners[0], key
    if name not in _field_names(sections[section]):
        keys = sorted(_field_names(sections[section]))
        raise ValueError(f"unknown config key {section}.{name}; keys of [{section}]: {keys}")
    return section, name, _toml_value(raw)


def _field_names(cls) -> set[str]:
    return {item.name for item in dataclasses.fields(cls)}


def _check_types(section: str, cls, values: dict[str, Any]) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    checked = {}
    for key, value in values.items():
        if key not in hints:
            raise ValueError(f"unknown config key {section}.{key}; keys of [{section}]: {sorted(hints)}")
        expected = hints[key]
        allowed = typing.get_args(expected) if typing.get_origin(expected) is Union else (expected,)
        if value is None and type(None) in allowed:
            checked[key] = value
            continue
        if float in allowed and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        plain = tuple(typing.get_origin(kind) or kind for kind in allowed if kind is not type(None))
        if not isinstance(value, plain) or (isinstance(value, bool) and bool not in plain):
            names = " or ".join(getattr(kind, "__name__", str(kind)) for kind in allowed)
            raise ValueError(f"{section}.{key} must be {names}, got {value!r}")
        checked[key] = value
    return checked


def _positive(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def _probability(name: str, value: Any) -> None:
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must lie in [0, 1), got {value!r}")


def check_choice(name: str, value: Any, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")
