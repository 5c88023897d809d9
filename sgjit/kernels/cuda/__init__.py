"""CuPy glue of the CUDA kernel families: one module per family, each an op (or two) of the ops
table built on `module.compile_kernels` and `module.launch`. Importing these needs no CuPy; building
an op compiles its instantiations and needs CuPy and a GPU."""
