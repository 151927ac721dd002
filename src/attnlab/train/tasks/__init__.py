"""Tasks that ``attnlab train`` can run, by name (``--set task=NAME``).

A task owns its data, model and report; the trainer, the run directory layout
(:mod:`attnlab.train.run_steps`) and the shared config sections are common to all.
Each task is one module that defines ``TASK``, a :class:`Task`: its runner, the config
sections of its own (``[image]`` for ``digits-text``), its defaults
(``section.key=value``, under whatever the user sets) and the shared settings it does
not read, which a config may then not set.

:data:`TASKS` names each built-in task and the module it lives in, as ``attnlab.cli``
does for subcommands; a module is imported when its task is asked for, so nothing
here imports a task (and no task imports back up the tree). A new task is a new module
in this folder and one line in :data:`TASKS`; code outside the package can
:func:`register_task` a :class:`Task` object instead.

A runner is ``run(config, run_dir, *, resume, quiet, device) -> RunResult``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Union

__all__ = ["Task", "TASKS", "DEFAULT_TASK", "register_task", "get_task", "task_names"]

DEFAULT_TASK = "text-classification"

# name -> (module defining TASK, one-line description)
TASKS: dict[str, Union[tuple[str, str], "Task"]] = {
    DEFAULT_TASK: ("attnlab.train.tasks.text_classification",
                   "text classification on the embedded snippets or a CSV/JSONL file"),
    "digits-text": ("attnlab.train.tasks.digits_text",
                    "true/false statements about scikit-learn's 8x8 handwritten digits, "
                    "with cross-modal attention"),
}


@dataclass(frozen=True)
class Task:
    """A named kind of run.

    Attributes:
        name: what ``--set task=NAME`` selects.
        description: one line for help texts.
        run: ``run(config, run_dir, *, resume, quiet, device) -> RunResult``.
        defaults: ``section.key=value`` settings applied before the user's own.
        sections: the task's own config sections, ``{name: settings dataclass}``.
        unused: shared settings (``"section.key"``) the task does not read; a config
            that sets one to anything but its default is refused.
        check: ``check(config)``, run before anything is written (data, splits, labels);
            raises ``ValueError`` / ``FileNotFoundError`` naming the setting to change.
    """

    name: str
    description: str
    run: Callable[..., Any]
    defaults: tuple[str, ...] = ()
    sections: Mapping[str, type] = field(default_factory=dict)
    unused: tuple[str, ...] = ()
    check: Optional[Callable[[Any], None]] = None


def register_task(task: Task) -> Task:
    """Add ``task`` to :data:`TASKS`; a name can be registered once."""
    if not isinstance(task, Task):
        raise TypeError(f"task must be a Task, got {type(task).__name__}")
    if task.name in TASKS:
        raise ValueError(f"a task named {task.name!r} is already registered")
    TASKS[task.name] = task
    return task


def get_task(name: str) -> Task:
    """The :class:`Task` called ``name``, importing its module on first use."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; tasks: {task_names()}")
    entry = TASKS[name]
    if isinstance(entry, Task):
        return entry
    task = importlib.import_module(entry[0]).TASK
    if not isinstance(task, Task) or task.name != name:
        raise TypeError(f"{entry[0]}.TASK must be a Task named {name!r}")
    return task


def task_names() -> list[str]:
    return sorted(TASKS)
