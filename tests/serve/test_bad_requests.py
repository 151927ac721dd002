"""Bad requests each get their 4xx JSON error and the server keeps serving; concurrent clients
are all answered, one forward at a time; the token and the loopback host are enforced."""

from __future__ import annotations

import json
import threading
import time

import pytest

from conftest import serve, tiny_decoder, word_tokenizer

TEXT = "the cat sat on the mat"

BAD = [  # (path, raw body, status, part of the error)
    ("api/view", b"", 400, "body is empty"),
    ("api/view", b"{\"text\": ", 400, "not JSON"),
    ("api/view", b"\xff\xfe\x00bad", 400, "not UTF-8"),
    ("api/view", b"[1, 2]", 400, "must be a JSON object"),
    ("api/view", json.dumps({"text": 42}).encode(), 400, "text must be a string"),
    ("api/view", json.dumps({"text": "   "}).encode(), 400, "text is empty"),
    ("api/view", json.dumps({"text": "cat " * 100}).encode(), 413, "at most 64"),
    ("api/view", json.dumps({"text": "x" * 30_000}).encode(), 413, "characters"),
    ("api/view", b"{\"text\": \"" + b"a" * 300_000 + b"\"}", 413, "bytes"),
    ("api/view", json.dumps({"text": TEXT, "off": "2:1"}).encode(), 400, "list of \"LAYER:HEAD\""),
    ("api/view", json.dumps({"text": TEXT, "off": ["2-1"]}).encode(), 400, "\"LAYER:HEAD\""),
    ("api/view", json.dumps({"text": TEXT, "off": ["3:1"]}).encode(), 422, "layer 3 does not exist"),
    ("api/view", json.dumps({"text": TEXT, "off": ["1:5"]}).encode(), 422, "head 5 of layer 1"),
    ("api/view", json.dumps({"text": TEXT, "off": ["0:1"]}).encode(), 422, "layer 0 does not exist"),
    ("api/map", json.dumps({"text": TEXT, "layer": "2", "head": 1}).encode(), 400, "layer must be an integer"),
    ("api/map", json.dumps({"text": TEXT, "layer": 2, "head": 9}).encode(), 422, "head must lie in 1..4"),
    ("api/map", json.dumps({"text": TEXT, "layer": 1, "head": 1, "rows": [3, 2]}).encode(), 422, "START < STOP"),
    ("api/map", json.dumps({"text": TEXT, "layer": 1, "head": 1, "rows": [0, 40]}).encode(), 422, "pass the text"),
    ("api/step", json.dumps({"text": TEXT, "generated": [1] * 8}).encode(), 413, "at most 7"),
    ("api/step", json.dumps({"text": TEXT, "generated": [10_000]}).encode(), 422, "outside the vocabulary"),
    ("api/step", json.dumps({"text": TEXT, "generated": ["a"]}).encode(), 400, "list of token ids"),
    ("api/explain", json.dumps({"text": TEXT, "method": "magic"}).encode(), 422, "not one of"),
    ("api/explain", json.dumps({"text": TEXT, "method": "flow"}).encode(), 422, "not one of"),
    ("api/patch", json.dumps({"text": TEXT, "source": "the cat", "heads": ["1:1"]}).encode(), 422, "one length"),
    ("api/patch", json.dumps({"text": TEXT, "source": TEXT, "heads": []}).encode(), 422, "heads is empty"),
    ("api/image", b"\x89PNG", 422, "reads text"),
    ("api/nowhere", b"{}", 404, "no such page"),
    ("api/../../etc/passwd", None, 404, "no such page"),
    ("assets/../app.py", None, 404, ""),
    ("assets/secret.txt", None, 404, "no asset"),
]


@pytest.mark.parametrize("path, raw, status, message", BAD, ids=[f"{i}-{b[0]}" for i, b in enumerate(BAD)])
def test_a_bad_request_gets_its_error_and_the_server_keeps_serving(decoder_server, path, raw, status,
                                                                    message) -> None:
    server, _ = decoder_server
    got, answer = server.request(path, raw=raw) if raw is not None else server.request(path)
    assert got == status, answer
    assert message in answer["error"]
    assert server.request("api/view", {"text": TEXT})[0] == 200


def test_a_wrong_method_is_refused_in_json(decoder_server) -> None:
    server, _ = decoder_server
    status, answer = server.request("api/info", {"text": TEXT})
    assert status == 405 and "method not allowed" in answer["error"]


def test_concurrent_clients_are_all_answered_one_forward_at_a_time() -> None:
    server, session = serve(tiny_decoder(), word_tokenizer())
    explorer = session.explorer
    running, overlaps, original = [0], [], explorer._forward

    def watched(*args):
        running[0] += 1
        overlaps.append(running[0])
        try:
            time.sleep(0.002)  # widen the window in which a second forward would show
            return original(*args)
        finally:
            running[0] -= 1

    explorer._forward = watched
    answers: list[int] = []
    latencies: list[float] = []

    def client(index: int) -> None:
        deadline = time.monotonic() + 2.0
        count = 0
        while time.monotonic() < deadline:
            body = {"text": f"the cat sat on the mat {'. the dog' * (count % 3)}", "off": [f"{1 + index % 2}:1"]}
            started = time.monotonic()
            status, _ = server.request("api/view", body)
            latencies.append(time.monotonic() - started)
            answers.append(status)
            count += 1

    try:
        clients = [threading.Thread(target=client, args=(index,)) for index in range(8)]
        for thread in clients:
            thread.start()
        for thread in clients:
            thread.join()
    finally:
        server.stop()
    assert answers and set(answers) == {200}
    assert len(answers) == len(latencies)  # none lost
    assert max(overlaps) == 1  # never two forwards at once


def test_a_token_is_required_when_set_and_the_page_sets_its_cookie() -> None:
    server, _ = serve(tiny_decoder(), word_tokenizer(), token="s3cret")
    try:
        status, answer = server.request("api/info")
        assert status == 403 and "token" in answer["error"]
        assert server.request("api/info", headers={"X-Attnlab-Token": "wrong"})[0] == 403
        assert server.request("api/info", headers={"X-Attnlab-Token": "s3cret"})[0] == 200
        assert server.request("api/info?token=s3cret")[0] == 200
        import urllib.request

        with urllib.request.urlopen(server.url + "?token=s3cret", timeout=30) as response:
            assert "attnlab_token=s3cret" in response.headers["set-cookie"]
            assert "HttpOnly" in response.headers["set-cookie"]
        assert server.request("api/info", headers={"Cookie": "attnlab_token=s3cret"})[0] == 200
    finally:
        server.stop()


def test_bound_to_the_loopback_a_foreign_host_name_is_refused(decoder_server) -> None:
    server, _ = decoder_server
    status, answer = server.request("api/info", headers={"Host": "attacker.example:8765"})
    assert status == 403 and "loopback" in answer["error"]
    assert server.request("api/info", headers={"Host": "localhost:8765"})[0] == 200
