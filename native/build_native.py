"""cffi (API, out-of-line) build of mmfs's C core: `mmfs._native`.

setuptools runs this through `cffi_modules` in pyproject.toml, so the module
is compiled by `pip install .` and never at import time.
"""

from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent
HEADERS = ("mmfs_native.h", "mmfs_fuse.h")
HEADER = "\n".join((HERE / name).read_text() for name in HEADERS)

ffibuilder = FFI()
# cdef takes the header minus preprocessor lines; the #defines become
# integer constants through the `...` form.
ffibuilder.cdef(
    "\n".join(
        line if not line.startswith("#define") else f"#define {line.split()[1]} ..."
        for line in HEADER.splitlines()
        if not line.startswith("#include")
    )
)
ffibuilder.set_source(
    "mmfs._native",
    "".join(f'#include "{name}"\n' for name in HEADERS),
    sources=[str(Path("native") / name) for name in ("mmfs_native.c", "mmfs_fuse.c", "mmfs_latency.c",
                                                       "mmfs_pickle.c")],
    include_dirs=[str(Path("native"))],
    # No FMA contraction: the blending weights must round exactly as Megatron's.
    extra_compile_args=["-O3", "-std=gnu11", "-ffp-contract=off"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
