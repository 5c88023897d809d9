"""The C++ CPU kernels: GEMMs on GGUF blocks repacked into panels (`gemm.cpp`, `panels.py`),
RMSNorm / add+RMSNorm / SiLU·mul / RoPE+KV store (`elementwise.cpp`) and paged attention
(`attention.cpp`), built on first use for this CPU's instruction set (`build.py`) and called through
the op table (`ops.py`, put together in `sgjit/kernels/cpu.py`). Every row's result depends on that
row alone, so the CPU path is batch-invariant."""
