"""``attnlab serve``: a live explorer of one model's attention in the browser.

The model is opened once (:func:`~attnlab.serve.session.open_session`: whatever ``--model``
opens in the other commands, and vision transformer directories) and served by a Starlette
app (:func:`~attnlab.serve.app.create_app`) on uvicorn: a page (``assets/``, package data,
nothing fetched at run time) and a JSON API. Every view is computed by attnlab's own
functions (``text_views``, ``image_views``); one forward runs at a time (``session``); every
request is bounded (``limits``) and checked field by field (``requests``). Starlette and
uvicorn are the ``serve`` extra (``pip install 'attnlab[serve]'``); importing this package
needs neither. The subcommand itself (its options, the port check, the server's start and
stop) is :mod:`attnlab.cli.serve`.
"""

__all__: list[str] = []
