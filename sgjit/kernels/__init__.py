"""The ops of the model and how they are chosen: the op table (`ops`), the torch reference
(`reference`), CPU variants (`cpu`), the CUDA kernels (`*.cu` + `cuda/`), the device profile
(`arch`), the selector (`selector`, over `spec`) and the table a runtime serves with (`table`).
Importing this package needs neither CuPy nor a GPU, and nothing of sgjit above it."""
