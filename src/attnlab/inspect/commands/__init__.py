"""The subcommands of ``attnlab`` that look inside attention: each ``*_command`` module is one
(``add_arguments(parser)`` and ``run(args)``, wired up by :mod:`attnlab.cli`); the work itself
is in :mod:`attnlab.workflows`.

Nothing is imported here, so that ``attnlab --help`` stays quick.
"""

__all__: list[str] = []
