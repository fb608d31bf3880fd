"""The compiled part of granndis-hpc: the C kernels of the CPU path (granndis_hpc/nn/cpu_kernels.c),
built when the package is built or installed, as the extension module granndis_hpc.nn._cpu_kernels.

Everything else is declared in pyproject.toml.  The extension is optional: where no C compiler is at
install time the package installs without it and the CPU path uses torch's ops (one warning at start-up;
GRANNDIS_CPU_KERNELS=native makes its absence an error instead).  One build serves x86-64 CPUs of
different generations: the hot loops are cloned for AVX-512, AVX2 and the baseline and the loader picks
one when the library is loaded (GCC's target_clones, cpu_kernels.c).
"""
from setuptools import Extension, setup

# -ffp-contract=off: a multiply and an add are never fused, so every product is rounded before it is added
# in the entries' order, as tests/unit/test_cpu_kernels.py checks bit for bit (GCC fuses them by default
# outside ISO C modes).  No -march: the clones carry the CPU-specific code.
KERNELS = Extension(
    "granndis_hpc.nn._cpu_kernels",
    sources=["granndis_hpc/nn/cpu_kernels.c", "granndis_hpc/nn/cpu_kernels_module.c"],
    extra_compile_args=["-O3", "-ffp-contract=off", "-fno-strict-aliasing"],
    libraries=["pthread"],
    optional=True,
)

setup(ext_modules=[KERNELS])
