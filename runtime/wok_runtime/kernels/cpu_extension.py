"""Small C++ kernels for the CPU, built on first use with torch's cpp_extension.

Only `--compile` asks for them: it already needs a C++ toolchain (g++ and ninja; the runtime
image has both). A build takes tens of seconds the first time and is cached where
TORCH_EXTENSIONS_DIR points, which `serve --compile` keys by the CPU (compile_cache.py;
`-march=native`: code built for one CPU must not reach another). A kernel that cannot be built
is None, and the caller keeps its torch path.
"""

from __future__ import annotations

import logging
import time
from types import ModuleType

log = logging.getLogger(__name__)


def build(
    name: str, source: str, functions: list[str], *, flags: tuple[str, ...] = ()
) -> ModuleType | None:
    """The extension `name` compiled from `source` (C++ with torch's headers), exporting
    `functions`; None, logged, if it cannot be built."""
    from torch.utils.cpp_extension import load_inline

    started = time.perf_counter()
    try:
        module = load_inline(
            name=name,
            cpp_sources=[source],
            functions=functions,
            extra_cflags=["-O3", "-march=native", *flags],
            verbose=False,
        )
    except Exception:
        log.warning("the CPU kernel %s could not be built", name, exc_info=True)
        return None
    log.info("CPU kernel %s ready in %.1f s", name, time.perf_counter() - started)
    return module
