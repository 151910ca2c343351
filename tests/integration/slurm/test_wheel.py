"""Templates are package data: a wheel built from the repository, installed into a fresh virtualenv,
emits every launcher. The build runs on a copy of the sources (no build/ or egg-info in the shared
tree); the fresh venv sees the already-installed dependencies through a .pth line instead of
downloading them, and never the repository's own `planner`.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.support.paths import EXAMPLES, ROOT

SOURCES = ("pyproject.toml", "README.md", "planner", "runtime", "templates")
TEMPLATES = ("templates/torchrun.sh.j2", "templates/job.sbatch.j2", "templates/megatron_args.sh.j2",
             "templates/_provenance.j2")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("wheel")
    source = work / "src"
    source.mkdir()
    for name in SOURCES:
        origin = ROOT / name
        if origin.is_dir():
            shutil.copytree(origin, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(origin, source / name)
    dist = work / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--quiet", "-w", str(dist), str(source)], check=True, timeout=300)
    [built] = dist.glob("moeplan-*.whl")
    return built


def test_the_wheel_carries_every_template(wheel: Path):
    names = set(zipfile.ZipFile(wheel).namelist())
    for template in TEMPLATES:
        assert template in names
    assert "planner/emit/render.py" in names and "planner/commands/emit.py" in names


def test_a_fresh_venv_with_the_wheel_emits_every_launcher(wheel: Path, tmp_path: Path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
                    "--no-index", "--quiet", str(wheel)], check=True, timeout=300)
    # The dependencies (jinja2, pydantic, typer, ...) come from the test interpreter's site-packages.
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    where = subprocess.run([str(python), "-c", "import planner, templates; print(planner.__file__); "
                            "print(templates.__file__)"], capture_output=True, text=True, check=True,
                           cwd=tmp_path).stdout.split()
    assert all(Path(path).is_relative_to(venv) for path in where), where

    config = tmp_path / "tiny.yaml"
    shutil.copy2(EXAMPLES / "tiny-cpu-8.yaml", config)
    out = tmp_path / "out"
    emitted = subprocess.run([str(venv / "bin" / "moeplan"), "emit", "all", str(config), "-o", str(out)],
                             capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert emitted.returncode == 0, emitted.stdout + emitted.stderr
    for name in ("plan.json", "torchrun.sh", "job.sbatch", "megatron_args.sh"):
        assert (out / name).is_file(), name
    assert (out / "torchrun.sh").read_text().startswith("#!/usr/bin/env bash\n")
    printed = subprocess.run(["bash", str(out / "megatron_args.sh")], capture_output=True, text=True,
                             check=True).stdout.splitlines()
    assert printed[0] == "pretrain_gpt.py" and "--expert-model-parallel-size" in printed
