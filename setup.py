"""The compiled form of the embedded broker's record walk (src/sparkeos/broker/record_walk.py), built with Cython
where it can be at install time. Nothing here may fail an install: without Cython, a C compiler or Python's
headers, or on a Cython error, the broker runs the same walk as plain Python. Everything else about the project is
in pyproject.toml."""

import hashlib
import shutil
import sys
from pathlib import Path

from setuptools import Extension, setup

SOURCE = Path("src/sparkeos/broker/record_walk.py")
TYPES = SOURCE.with_suffix(".pxd")
# The module is compiled from a copy that carries the digest of the source and its types, which
# record_validation.py compares with the files next to it: after an edit of either, the broker runs the plain
# Python until the next install.
COPY_ROOT = Path("build/cython")
COPY = COPY_ROOT / "sparkeos/broker/_record_walk.py"


def compiled_source() -> str:
    COPY.parent.mkdir(parents=True, exist_ok=True)
    code = SOURCE.read_bytes()
    digest = hashlib.sha256(code + TYPES.read_bytes()).hexdigest()
    COPY.write_bytes(code + f'\n\nSOURCE_DIGEST = "{digest}"\n'.encode())
    shutil.copyfile(TYPES, COPY.with_suffix(".pxd"))
    return str(COPY)


def extensions() -> list[Extension]:
    try:
        from Cython.Build import cythonize

        built = cythonize(
            [Extension("sparkeos.broker._record_walk", [compiled_source()])],
            # The types are the .pxd's; the .py's annotations are for its readers (an `int` there is any Python int).
            compiler_directives={"language_level": 3, "annotation_typing": False},
            # Where Cython finds sparkeos/broker/_record_walk.pxd for the module of that name.
            include_path=[str(COPY_ROOT)],
            quiet=True,
        )
    except Exception as error:  # noqa: BLE001 - any failure here leaves the plain walk, never a failed install
        print(f"warning: the broker's record walk is not compiled ({error!r}); it runs as plain Python",
              file=sys.stderr)
        return []
    # Set here: cythonize makes Extensions of its own, without the flag. Optional, a failed C compile is a warning.
    for extension in built:
        extension.optional = True
    return built


setup(ext_modules=extensions())
