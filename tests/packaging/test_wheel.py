"""The wheel and the sdist, installed as a user installs them: not editable, outside the checkout.

``python -m build`` makes the sdist and builds the wheel from it (so a file missing from the
sdist fails here too). The wheel goes into a fresh virtual environment that sees none of
the checkout: its dependencies come from the test environment's site-packages through a
path file, which adds their folder to ``sys.path`` without running the editable install's
finder, and every command runs in an empty folder. There the CLI runs a short job, the
native kernels compile from the installed sources into an empty cache, the report page
finds its assets, and both packaged models open.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("build", reason="the packaging test builds with `build` (pip install -e '.[dev]')")
pytestmark = pytest.mark.slow


def _run(command: list, cwd: Path, env: dict, timeout: float = 600) -> str:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(map(str, command))} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The built distributions, and a fresh environment with the wheel installed."""
    where = tmp_path_factory.mktemp("wheel")
    dist = where / "dist"
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(ROOT)], where, env)
    wheel, = dist.glob("attnlab-*.whl")
    sdist, = dist.glob("attnlab-*.tar.gz")

    venv = where / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], where, env)
    python = venv / "bin" / "python"
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     where, env).strip())
    (site / "_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", str(wheel)], where, env)

    work = where / "work"
    work.mkdir()
    env = {**env, "TORCH_EXTENSIONS_DIR": str(where / "extensions"), "PATH": f"{venv / 'bin'}:{env['PATH']}"}
    return {"wheel": wheel, "sdist": sdist, "python": str(python), "work": work, "env": env, "venv": venv}


def test_the_wheel_holds_the_sources_and_assets_attnlab_reads_at_run_time(installed: dict) -> None:
    names = set(zipfile.ZipFile(installed["wheel"]).namelist())
    for needed in ("attnlab/_native/decode_step.cpp", "attnlab/_native/skinny.h",
                   "attnlab/attention/sparse/_block_window_amx.cpp", "attnlab/cli/__init__.py"):
        assert needed in names, f"{needed} is missing from the wheel"
    assert any(name.startswith("attnlab/inspect/draw/assets/") and name.endswith(".js") for name in names)
    for page in ("index.html", "serve.js", "serve.css"):  # attnlab serve's page
        assert f"attnlab/serve/assets/{page}" in names, f"attnlab/serve/assets/{page} is missing from the wheel"
    assert not any(name.startswith(("tests/", "benchmarks/")) for name in names)


def test_the_installed_package_is_the_one_imported(installed: dict) -> None:
    where = _run([installed["python"], "-c", "import attnlab; print(attnlab.__file__)"],
                 installed["work"], installed["env"]).strip()
    assert Path(where).is_relative_to(installed["venv"]), where
    assert not Path(where).is_relative_to(ROOT), where


def test_the_native_kernels_compile_from_the_installed_sources(installed: dict) -> None:
    out = _run([installed["python"], "-c",
                "from attnlab import _native; from attnlab._skinny import skinny_kernel_status\n"
                "print(_native.status('causal_softmax')); print(skinny_kernel_status())"],
               installed["work"], installed["env"], timeout=900)
    assert out.splitlines()[0].startswith("ready"), out
    assert out.splitlines()[1].startswith("ready"), out
    assert any((Path(installed["env"]["TORCH_EXTENSIONS_DIR"])).rglob("*.so"))


def test_the_cli_runs_a_short_job_and_writes_a_report_with_its_assets(installed: dict) -> None:
    work, env = installed["work"], installed["env"]
    out = work / "report"
    _run(["attnlab", "inspect", "--model", "minilm", "--text", "The cat sat on the mat.", "--out", str(out)],
         work, env)
    pages = list(out.rglob("*.html"))
    assert pages, sorted(str(path) for path in out.rglob("*"))
    page = pages[0].read_text()
    assert "<script" in page and "<style" in page  # the assets are inlined from the installed package


def test_the_packaged_models_open_from_the_installed_package(installed: dict) -> None:
    out = _run([installed["python"], "-c",
                "import attnlab\n"
                "for name in ('minilm', 'smollm2'):\n"
                "    model, tokenizer, config = attnlab.load(name)\n"
                "    print(name, type(model).__name__, len(tokenizer.encode('Paris is').ids))"],
               installed["work"], installed["env"])
    assert "minilm" in out and "smollm2" in out, out
