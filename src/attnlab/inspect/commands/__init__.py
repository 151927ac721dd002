"""What the commands do. Each ``*_command`` module is one subcommand of ``attnlab``
(``add_arguments(parser)`` and ``run(args)``, wired up by :mod:`attnlab.cli`); the
work itself is in ``inspect_text`` (one text: pictures and ``report.html``),
``analyze_texts`` (a data set: ``statistics.json``, plots, ``summary.html``),
``explain_text`` (one text: every attribution method's scores, JSON, PNG, page),
``explain_generation`` (a decoder's prompts: what made each generated token, the logit
lens), ``compare_models`` (two models' statistics and differences) and ``resolve`` (what
``--model`` names).

Nothing is imported here, so that ``attnlab --help`` stays quick.
"""

__all__: list[str] = []
