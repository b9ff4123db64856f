"""cffi (API, out-of-line) build of mmfs's C core: `mmfs._native`.

setuptools runs this through `cffi_modules` in pyproject.toml, so the module
is compiled by `pip install .` and never at import time.
"""

import runpy
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent

# The mount contract's facts the C core needs, from their one home (a
# standard-library module, run by path: the package need not be importable).
CONTRACT = runpy.run_path(str(HERE.parent / "mmfs" / "mount" / "contract.py"))


def write_if_changed(path: Path, text: str) -> None:
    """Write `text` only when it differs: a rewritten header, though the same, is newer
    than the venv's stamp, and `make` would reinstall everything."""
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


write_if_changed(HERE / "mmfs_contract.h", CONTRACT["c_header"]())
HEADERS = ("mmfs_native.h", "mmfs_files.h", "mmfs_views.h", "mmfs_fuse.h", "mmfs_randperm.h", "mmfs_placing.h")
HEADER = "\n".join((HERE / name).read_text() for name in HEADERS)
SOURCES = ("mmfs_index.c", "mmfs_readers.c", "mmfs_files.c", "mmfs_views.c", "mmfs_fuse.c", "mmfs_latency.c",
           "mmfs_randperm.c", "mmfs_pickle.c", "mmfs_placing.c")


def cdef_line(line: str) -> str:
    """A header line as cdef takes it: #defines of a value become integer
    constants through the `...` form; other preprocessor lines (includes,
    include guards) are dropped."""
    words = line.split()
    if line.startswith("#define") and len(words) > 2:
        return f"#define {words[1]} ..."
    return "" if line.startswith("#") else line


ffibuilder = FFI()
ffibuilder.cdef("\n".join(cdef_line(line) for line in HEADER.splitlines()))
ffibuilder.set_source(
    "mmfs._native",
    "".join(f'#include "{name}"\n' for name in HEADERS),
    sources=[str(Path("native") / name) for name in SOURCES],
    include_dirs=[str(Path("native"))],
    # No FMA contraction: the blending weights must round exactly as Megatron's.
    extra_compile_args=["-O3", "-std=gnu11", "-ffp-contract=off"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
