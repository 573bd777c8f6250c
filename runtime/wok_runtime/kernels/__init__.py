"""CPU kernels: C++ extensions built on first use (`cpu_extension`), the GEMM and paged-decode
kernels built on them, and the cache of compiled artefacts (`compile_cache`)."""
