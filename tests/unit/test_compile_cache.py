"""`--compile`'s builds are cached per CPU (compile_cache.py): a key of what native code was
built for, and torch's cache variables pointed under it."""

from __future__ import annotations

from pathlib import Path

import pytest

from wok_runtime.kernels.compile_cache import (
    EXTENSIONS_ENV,
    INDUCTOR_ENV,
    PRECOMPILED_HEADERS_ENV,
    cache_dirs,
    configure,
    cpu_key,
    this_cpu_key,
)

AMX = """processor : 0
model name : Intel(R) Xeon(R) Platinum 8480+
cpu MHz : 2000.000
flags : fpu avx512f avx512_bf16 amx_bf16 amx_tile
processor : 1
model name : Intel(R) Xeon(R) Platinum 8480+
cpu MHz : 3100.000
flags : fpu avx512f avx512_bf16 amx_bf16 amx_tile
"""
NO_AMX = AMX.replace(" amx_bf16 amx_tile", "").replace(
    "Intel(R) Xeon(R) Platinum 8480+", "AMD EPYC 9654"
)


def key(cpuinfo: str, torch_version: str = "2.9.0") -> str:
    return cpu_key(cpuinfo, machine="x86_64", torch_version=torch_version)


def test_the_key_follows_what_the_code_is_built_for() -> None:
    assert key(AMX) == key(AMX.replace("2000.000", "2400.000"))  # frequency: the same code
    assert key(AMX) == key(AMX.replace("fpu avx512f", "avx512f fpu"))  # flag order
    assert key(AMX) != key(NO_AMX)  # an AMX build faults on a CPU without AMX
    assert key(AMX) != key(AMX, torch_version="2.10.0")
    assert key(AMX).startswith("x86_64-")
    arm = "processor : 0\nCPU part : 0xd40\nFeatures : fp asimd sve bf16\n"
    assert key(arm) != key(arm.replace(" sve", ""))
    assert this_cpu_key() == this_cpu_key()


def test_configure_points_torch_under_the_cpus_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(EXTENSIONS_ENV, raising=False)
    monkeypatch.delenv(INDUCTOR_ENV, raising=False)
    monkeypatch.delenv(PRECOMPILED_HEADERS_ENV, raising=False)
    chosen = configure(tmp_path, key="x86_64-abc")
    want = cache_dirs(tmp_path, "x86_64-abc")
    # precompiled headers off: torch would write them to the pod's small /tmp, not the cache
    assert chosen == {
        **{env: str(path) for env, path in want.items()},
        PRECOMPILED_HEADERS_ENV: "0",
    }
    assert all(path.is_dir() for path in want.values())
    assert str(tmp_path / "compile" / "x86_64-abc") in chosen[INDUCTOR_ENV]


def test_a_cache_the_user_chose_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(EXTENSIONS_ENV, "/mine")
    monkeypatch.delenv(INDUCTOR_ENV, raising=False)
    monkeypatch.setenv(PRECOMPILED_HEADERS_ENV, "1")
    chosen = configure(tmp_path, key="k")
    assert chosen[EXTENSIONS_ENV] == "/mine"
    assert chosen[PRECOMPILED_HEADERS_ENV] == "1"
    assert chosen[INDUCTOR_ENV] == str(tmp_path / "compile" / "k" / "inductor")


def test_serve_with_compile_keeps_its_builds_in_the_cache_volume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    from wok.cli import build_parser
    from wok_runtime.core import model_runner
    from wok_runtime.http.serve import _build_runner

    monkeypatch.setenv("WOK_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(EXTENSIONS_ENV, raising=False)
    monkeypatch.delenv(INDUCTOR_ENV, raising=False)
    monkeypatch.delenv(PRECOMPILED_HEADERS_ENV, raising=False)
    built: list[dict] = []  # the runner itself is not built: only where its builds would go
    monkeypatch.setattr(
        model_runner.ModelRunner, "from_source", staticmethod(lambda *a, **kw: built.append(kw))
    )
    args = build_parser().parse_args(["runtime", "serve", "--device", "cpu", "--compile"])
    _build_runner(args)
    assert built and built[0]["compile"] is True
    base = tmp_path / "compile" / this_cpu_key()
    assert os.environ[INDUCTOR_ENV] == str(base / "inductor")
    assert os.environ[EXTENSIONS_ENV] == str(base / "torch_extensions")
