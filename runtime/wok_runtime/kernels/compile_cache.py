"""Where `--compile`'s builds are kept: one cache per CPU, under wok's cache directory.

`--compile` builds two kinds of native code: the CPU kernels (cpu_extension.py, C++ with
`-march=native`) and inductor's compiled step (step_graph.py, C++ or Triton). Both are tens of
seconds to a minute on first start. Kept in the pod's cache volume (`$WOK_CACHE_DIR`,
/var/cache/wok in the runtime image), a second start on the same node reuses them. A volume
may be shared by nodes of different CPUs (or the image's build machine), and code built for one
CPU's instructions faults on a CPU without them: so the builds live under a key of what they
were built for (the CPU's model and instruction-set flags, the machine, torch's version), and a
CPU with another key builds its own instead of loading another's.

`configure` points torch at the key's directories (TORCH_EXTENSIONS_DIR for cpp_extension,
TORCHINDUCTOR_CACHE_DIR for inductor) unless the user set them; the runner calls it before
`--compile` builds anything. It also turns off inductor's precompiled headers: torch writes them
(about 150 MB per set of flags) under the temp directory, not its cache directory, which in a pod
is a 64 MiB memory-backed /tmp (the build fails, "No space left on device") and gone at the next
start; the compiled step is in the cache directory, so only a first start parses the headers.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
from pathlib import Path

log = logging.getLogger(__name__)

#: The variables torch reads for where it keeps built code; ours unless already set.
EXTENSIONS_ENV = "TORCH_EXTENSIONS_DIR"
INDUCTOR_ENV = "TORCHINDUCTOR_CACHE_DIR"
PRECOMPILED_HEADERS_ENV = "TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS"


def cpu_key(cpuinfo: str, *, machine: str, torch_version: str) -> str:
    """A short key naming what native code built here runs on: the first processor's model name
    and sorted instruction-set flags (x86 `flags`, Arm `Features`), the machine, torch's
    version. Core counts, frequencies and bug lists do not change the code and are left out."""
    model, flags = "", ""
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        name, value = name.strip().lower(), value.strip()
        if name in ("model name", "cpu model", "cpu part") and not model:
            model = value
        elif name in ("flags", "features") and not flags:
            flags = " ".join(sorted(value.split()))
    record = "\n".join([machine, model, flags, torch_version])
    return f"{machine}-{hashlib.sha256(record.encode()).hexdigest()[:16]}"


def this_cpu_key() -> str:
    import torch

    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux: the processor's name is all there is
        cpuinfo = f"model name: {platform.processor()}"
    return cpu_key(cpuinfo, machine=platform.machine(), torch_version=torch.__version__)


def cache_dirs(root: Path, key: str) -> dict[str, Path]:
    base = root / "compile" / key
    return {EXTENSIONS_ENV: base / "torch_extensions", INDUCTOR_ENV: base / "inductor"}


def configure(root: Path, key: str | None = None) -> dict[str, str]:
    """Sets torch's build caches to `root`/compile/KEY (this CPU's key by default) and turns
    off precompiled headers, leaving a variable the user set alone; returns the variables as
    they now are."""
    key = key or this_cpu_key()
    for env, path in cache_dirs(root, key).items():
        if not os.environ.get(env):
            path.mkdir(parents=True, exist_ok=True)
            os.environ[env] = str(path)
    os.environ.setdefault(PRECOMPILED_HEADERS_ENV, "0")
    chosen = {
        env: os.environ[env] for env in (EXTENSIONS_ENV, INDUCTOR_ENV, PRECOMPILED_HEADERS_ENV)
    }
    log.info("compiled code cached for CPU %s: %s", key, chosen)
    return chosen
