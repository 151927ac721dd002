"""What the commands do, as functions a Python user calls: a model opened, attention computed,
files written. Each ``attnlab`` subcommand (:mod:`attnlab.cli`) parses and checks its
arguments, calls one of these and prints what came back.

``resolve`` (what ``--model`` names: :func:`~attnlab.workflows.resolve.resolve_model`),
``inspect_text`` (one text: pictures and ``report.html``), ``inspect_pair`` (a source/target
pair through an encoder-decoder), ``inspect_image`` and ``inspect_vision_language`` (an image),
``analyze_texts`` (a data set: ``statistics.json``, plots, ``summary.html``), ``generate_text``
(a prompt continued, with its report), ``explain_text`` (one text: every attribution method's
scores, JSON, PNG, page), ``explain_generation`` (a decoder's prompts: what made each generated
token, the logit lens), ``explain_image`` (an image classifier's class over the patches),
``compare_models`` (two models' statistics and differences) and ``image_attention`` (a
digits-text model's text-to-patch attention drawn).

This floor sits above :mod:`attnlab.inspect`, :mod:`attnlab.hf`, :mod:`attnlab.checkpoints`
and :mod:`attnlab.data`, and below :mod:`attnlab.serve` and :mod:`attnlab.cli`; it never
imports either. Nothing is imported here, so that ``attnlab --help`` stays quick.
"""

__all__: list[str] = []
