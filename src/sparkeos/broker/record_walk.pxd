# C types for record_walk.py's variables, read by Cython when setup.py compiles that file (as _record_walk).
# Lengths, positions and varints are C integers: record_walk.py keeps every value it computes within 64 bits, so
# that both forms read and refuse the same records.
import cython


@cython.locals(twice=cython.Py_ssize_t, byte=cython.int, low=cython.int, size=cython.Py_ssize_t,
               stop=cython.Py_ssize_t, delta=cython.Py_ssize_t, length=cython.Py_ssize_t,
               headers=cython.Py_ssize_t)
cpdef list walk(const unsigned char[:] data, Py_ssize_t pos, Py_ssize_t end, Py_ssize_t count, bint compacted)


@cython.locals(byte=cython.int, length=cython.Py_ssize_t)
cdef Py_ssize_t _headers(const unsigned char[:] data, Py_ssize_t pos, Py_ssize_t stop, Py_ssize_t count) except -1


# `decoded` is signed, `value` and `byte` unsigned: the zigzag decoding of an int64 wraps as two's complement.
@cython.locals(value=cython.ulonglong, byte=cython.ulonglong, shift=cython.int, decoded=cython.longlong)
cdef tuple _varint(const unsigned char[:] data, Py_ssize_t pos, int bits)
