"""``attnlab train``'s entry point: run the task a :class:`RunConfig` names.

The task's module (see :mod:`attnlab.train.tasks`) does the work with the shared steps
of :mod:`attnlab.train.run_steps`; this module only picks it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

from .run_checks import check_run
from .run_config import RunConfig
from .run_dir import release_run_dir
from .run_steps import CONFIG_FILE, RunResult
from .tasks import get_task

__all__ = ["RunResult", "train_run"]


def train_run(config: RunConfig, run_dir: Union[str, Path], *, resume: bool = False, quiet: bool = False,
              device: Optional[str] = None) -> RunResult:
    """Run the whole job of the config's task; returns the test report (process 0 writes every file).

    With ``resume``, the run directory's own ``config.json`` decides the task.
    """
    if resume:
        config_path = Path(run_dir) / CONFIG_FILE
        if config_path.is_file():
            config = RunConfig.from_json(config_path)
    check_run(config, device)  # before anything is written: a failed start leaves nothing behind
    try:
        return get_task(config.data.task).run(config, run_dir, resume=resume, quiet=quiet, device=device)
    finally:
        release_run_dir(Path(run_dir))  # taken when the directory was checked or made
