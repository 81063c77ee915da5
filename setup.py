"""The compiled form of the embedded broker's record walk (src/sparkeos/broker/record_walk.py), built with Cython
where a C compiler is there at install time. The extension is optional: without a compiler the install goes on
and the broker runs the same walk as plain Python. Everything else about the project is in pyproject.toml."""

import hashlib
import shutil
from pathlib import Path

from Cython.Build import cythonize
from setuptools import Extension, setup

SOURCE = Path("src/sparkeos/broker/record_walk.py")
# The module is compiled from a copy that carries the source's digest, which record_validation.py compares with
# the record_walk.py next to it: an edit after the install makes the broker run the plain Python again.
COPY_ROOT = Path("build/cython")
COPY = COPY_ROOT / "sparkeos/broker/_record_walk.py"


def compiled_source() -> str:
    COPY.parent.mkdir(parents=True, exist_ok=True)
    code = SOURCE.read_bytes()
    digest = hashlib.sha256(code).hexdigest()
    COPY.write_bytes(code + f'\n\nSOURCE_DIGEST = "{digest}"\n'.encode())
    shutil.copyfile(SOURCE.with_suffix(".pxd"), COPY.with_suffix(".pxd"))
    return str(COPY)


extensions = cythonize(
    [Extension("sparkeos.broker._record_walk", [compiled_source()])],
    # The types are the .pxd's; the annotations of the .py are for its readers (an `int` there is any Python int).
    compiler_directives={"language_level": 3, "annotation_typing": False},
    # Where Cython finds sparkeos/broker/_record_walk.pxd for the module of that name.
    include_path=[str(COPY_ROOT)],
    quiet=True,
)
# Set here: cythonize makes Extensions of its own, without the flag.
for extension in extensions:
    extension.optional = True
setup(ext_modules=extensions)
