"""Shared test set-up: every test starts from the same random state."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from hypothesis import settings

# Property tests: few examples (the suite must stay fast on a small CPU) and no
# per-example deadline (the first call into a kernel may be slow).
settings.register_profile("attnlab", max_examples=30, deadline=None, derandomize=True)
settings.load_profile("attnlab")


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--device", default="cpu",
        help="the device the device suite (tests taking the `device` fixture: tests/parity/test_device_parity.py) "
             "runs attnlab on, against references on the CPU: cpu (default), cuda, cuda:1, mps",
    )


def pytest_configure(config: pytest.Config) -> None:
    name = config.getoption("--device")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise pytest.UsageError(f"--device {name}: not a device torch knows (cpu, cuda, cuda:1, mps)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError(f"--device {name}: this torch sees no CUDA device (a CPU build, or no GPU); "
                                f"`make test-cuda` installs a CUDA build")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise pytest.UsageError(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) here")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise pytest.UsageError(f"--device {name}: this torch sees no MPS device")


@pytest.fixture
def run_benchmark():
    """``run_benchmark("offload", [...])``: ``benchmarks/offload.py``'s ``main`` called with
    those arguments, the script loaded as a module for the call, ``benchmarks/`` on the path as
    when it runs as a script (its exit code returned)."""
    import importlib.util
    import sys

    def run(name: str, arguments: list[str]) -> int:
        folder = Path(__file__).resolve().parents[1] / "benchmarks"
        spec = importlib.util.spec_from_file_location(f"attnlab_benchmark_{name}", folder / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        sys.path.insert(0, str(folder))  # as for `python benchmarks/NAME.py`: its sibling modules import
        try:
            spec.loader.exec_module(module)
            return module.main(arguments)
        finally:
            sys.path.remove(str(folder))
            sys.modules.pop(spec.name, None)

    return run


@pytest.fixture(scope="session")
def device(request: pytest.FixtureRequest) -> torch.device:
    """The device ``--device`` names (default the CPU)."""
    return torch.device(request.config.getoption("--device"))


CHROMIUM_PATH = Path("/usr/bin/chromium")


@pytest.fixture(scope="module")
def chromium():
    """Debian's headless chromium through playwright (skipped where it is not installed)."""
    if not CHROMIUM_PATH.exists():
        pytest.skip("Debian's chromium is not installed at /usr/bin/chromium (make test installs it)")
    playwright_api = pytest.importorskip("playwright.sync_api")
    arguments = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
    with playwright_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM_PATH), args=arguments)
        yield launched
        launched.close()


def pytest_runtest_setup(item: pytest.Item) -> None:
    """``@pytest.mark.needs_cxx`` tests run torch.compile on CPU: skipped without a C++ compiler."""
    compilers = ("c++", "g++", "clang++")
    if item.get_closest_marker("needs_cxx") and not any(shutil.which(name) for name in compilers):
        pytest.skip("torch.compile on CPU needs a C++ compiler")


def _llama_cpp_permute(weight, heads):
    """llama.cpp's convert_hf_to_gguf permutation of a query or key projection."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(
        weight.shape)


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory):
    """A float32 GGUF file of a tiny random Llama (vocabulary 40, 2 layers, context 64), with a
    byte-level BPE tokenizer in its metadata; made by transformers and gguf at test time."""
    transformers = pytest.importorskip("transformers", reason="the tiny model is made with transformers")
    gguf = pytest.importorskip("gguf", reason="reading GGUF needs the gguf package (pip install gguf)")
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=40, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                                      hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      tie_word_embeddings=True)
    state = transformers.LlamaForCausalLM(config).state_dict()
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_context_length(64)
    writer.add_embedding_length(32)
    writer.add_feed_forward_length(48)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000.0)
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *"abcdefghijklmnopqrstuvwxyz",
              "Ġ", "ab", "Ġa", "abc", "Ġab", *(f"x{index}" for index in range(6))]
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_merges(["a b", "Ġ a", "ab c", "Ġa b"])
    writer.add_token_types([3, 3, 3] + [1] * (len(tokens) - 3))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_tensor("token_embd.weight", state["model.embed_tokens.weight"].numpy())
    writer.add_tensor("output_norm.weight", state["model.norm.weight"].numpy())
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
             "self_attn.o_proj": "attn_output", "self_attn.v_proj": "attn_v", "mlp.gate_proj": "ffn_gate",
             "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for i in range(2):
        for hf, ours in names.items():
            writer.add_tensor(f"blk.{i}.{ours}.weight", state[f"model.layers.{i}.{hf}.weight"].numpy())
        for part, heads in (("q", 4), ("k", 2)):
            weight = _llama_cpp_permute(state[f"model.layers.{i}.self_attn.{part}_proj.weight"], heads)
            writer.add_tensor(f"blk.{i}.attn_{part}.weight", weight.numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture
def measured_faithfulness(monkeypatch):
    """Lay out the faithfulness figures a test reads instead of the packaged ones: ``lay_out(kind,
    family, {method: mean})`` gives every method (and ``random``, mean ``random_mean``) an interval of
    mean ± 0.1 on deletion AOPC, the primary measure; returns the figures."""
    def lay_out(kind: str, family: str, means: dict, random_mean: float = 1.0) -> dict:
        rows = {name: [mean, mean - 0.1, mean + 0.1] for name, mean in {**means, "random": random_mean}.items()}
        data = {"primary": "deletion_aopc", "measures": {"deletion_aopc": {"higher_is_better": True}},
                "families": [{"family": family, "kind": kind, "model": f"a measured {family}", "quantity": "q",
                              "texts": 50, "figures": {"deletion_aopc": rows}}]}
        monkeypatch.setattr("attnlab.inspect.faithfulness.load_figures", lambda: data)
        return data

    return lay_out
