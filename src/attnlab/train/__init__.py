"""Training: TransformerTrainer, schedules, checkpoints, callbacks, distributed set-up."""

from .._files import CorruptFileError
from .callbacks import EVENTS, MetricsLogger, ProgressBar, TensorBoardLogger
from .checkpoint import check_checkpoint, find_resumable, load_trainer_state, save_checkpoint
from .interrupts import NonFiniteLossError, TrainingInterrupted
from .metrics import accuracy_and_f1
from .optimizer import build_optimizer, decay_parameter_groups
from .schedules import WarmupCosine, warmup_cosine_schedule, warmup_cosine_scheduler
from .trainer import TrainerState, TransformerTrainer
from .visualize import attention_map, save_attention_map

__all__ = [
    "CorruptFileError",
    "EVENTS",
    "MetricsLogger",
    "NonFiniteLossError",
    "ProgressBar",
    "TensorBoardLogger",
    "TrainingInterrupted",
    "TrainerState",
    "TransformerTrainer",
    "WarmupCosine",
    "accuracy_and_f1",
    "attention_map",
    "build_optimizer",
    "check_checkpoint",
    "decay_parameter_groups",
    "find_resumable",
    "load_trainer_state",
    "save_attention_map",
    "save_checkpoint",
    "warmup_cosine_schedule",
    "warmup_cosine_scheduler",
]
