"""Training: TransformerTrainer, schedules, checkpoints, distributed set-up."""

from .checkpoint import load_trainer_state, save_checkpoint
from .schedules import WarmupCosine, warmup_cosine_schedule, warmup_cosine_scheduler

__all__ = [
    "WarmupCosine",
    "load_trainer_state",
    "save_checkpoint",
    "warmup_cosine_schedule",
    "warmup_cosine_scheduler",
]
