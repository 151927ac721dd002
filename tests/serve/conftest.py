"""Small models and a real server (uvicorn on 127.0.0.1, a free port, in a thread) for the explorer's tests."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Optional

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers

pytest.importorskip("starlette", reason="the explorer needs the serve extra: pip install 'attnlab[serve]'")
uvicorn = pytest.importorskip("uvicorn", reason="the explorer needs the serve extra: pip install 'attnlab[serve]'")

from attnlab.data.tokenizer import Tokenizer as AttnlabTokenizer  # noqa: E402
from attnlab.layers.decoder_config import DecoderConfig  # noqa: E402
from attnlab.models.classifier import EncoderClassifier  # noqa: E402
from attnlab.models.decoder.causal_lm import DecoderForCausalLM  # noqa: E402
from attnlab.models.encoder import TransformerEncoder  # noqa: E402
from attnlab.serve.app import create_app  # noqa: E402
from attnlab.serve.limits import ServeLimits  # noqa: E402
from attnlab.serve.session import ModelSession  # noqa: E402
from attnlab.serve.text_views import TextExplorer  # noqa: E402

WORDS = ("the a cat dog sat on mat film movie was is great bad fun boring and but not very plot . ,").split()


def word_tokenizer() -> AttnlabTokenizer:
    """Word-level: [PAD]=0, [UNK]=1, then the words (no special tokens added around a text)."""
    vocabulary = ["[PAD]", "[UNK]"] + WORDS
    backend = Tokenizer(models.WordLevel({token: i for i, token in enumerate(vocabulary)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return AttnlabTokenizer(backend)


def tiny_decoder(seed: int = 0) -> DecoderForCausalLM:
    torch.manual_seed(seed)
    model = DecoderForCausalLM(DecoderConfig(vocab_size=len(WORDS) + 2, d_model=32, num_layers=2, num_heads=4,
                                             d_ff=64, max_len=128)).eval()
    with torch.no_grad():  # larger weights than the default: a prediction each head moves
        for parameter in model.parameters():
            parameter.mul_(4.0 if parameter.dim() > 1 else 1.0)
    return model


def tiny_classifier(seed: int = 0) -> EncoderClassifier:
    torch.manual_seed(seed)
    encoder = TransformerEncoder(len(WORDS) + 2, d_model=16, num_layers=2, num_heads=4, d_ff=32, dropout=0.0,
                                 max_len=128, pad_id=0)
    return EncoderClassifier(encoder, 2, label_names=["negative", "positive"], dropout=0.0).eval()


class RunningServer:
    """uvicorn serving ``app`` on 127.0.0.1 in a thread; ``url`` once started."""

    def __init__(self, app: Any) -> None:
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
        self.server.install_signal_handlers = lambda: None  # not the main thread
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/"

    def request(self, path: str, body: Any = None, *, raw: Optional[bytes] = None,
                headers: Optional[dict] = None) -> tuple[int, Any]:
        """``(status, JSON answer)`` of a GET (no body) or a POST of ``body`` as JSON (or ``raw`` bytes)."""
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        request = urllib.request.Request(self.url + path.lstrip("/"), data=data, headers=headers or {},
                                         method="GET" if data is None else "POST")
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def serve(model: Any, tokenizer: Any = None, *, token: Optional[str] = None, limits: Optional[ServeLimits] = None,
          explorer: Any = None) -> tuple[RunningServer, ModelSession]:
    limits = limits or ServeLimits(max_tokens=64, max_new_tokens=8)
    session = ModelSession(explorer or TextExplorer(model, tokenizer, "tiny", limits), limits)
    return RunningServer(create_app(session, token=token)), session


@pytest.fixture(scope="module")
def decoder_server():
    server, session = serve(tiny_decoder(), word_tokenizer())
    yield server, session
    server.stop()


@pytest.fixture(scope="module")
def classifier_server():
    server, session = serve(tiny_classifier(), word_tokenizer())
    yield server, session
    server.stop()

