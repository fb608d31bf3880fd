"""Restricted unpickling for the Planetoid `ind.*` files.

The Kipf/Planetoid files are Python 2 pickles.  A pickle can call any importable callable while it
loads (``os.system``, ``eval``, ...), so `pickle.load` on a file from the internet is code execution.
This unpickler resolves only the handful of globals these files really contain and maps each to a
harmless local object:

* ``numpy.ndarray``, ``numpy.dtype``, ``numpy.core.multiarray._reconstruct`` -- dense arrays;
* ``scipy.sparse.csr.csr_matrix`` (and the newer module spellings) -- mapped to `SparseState`,
  an inert holder of the pickled attribute dict; `to_dense` rebuilds a validated CSR from it, so no
  scipy code runs on untrusted state during unpickling;
* ``collections.defaultdict`` and ``list`` -- the adjacency dict ``{vertex: [neighbours]}``;
* ``_codecs.encode`` restricted to latin-1 -- how Python 3 writes array bytes at protocol 2 (files
  re-saved under Python 3).

Anything else raises `DataError` before it is called.  Arrays of Python objects are refused too.
"""
from __future__ import annotations

import pickle

import numpy as np
import scipy.sparse as sp

from granndis_hpc.preprocess.sources.canonical import DataError

# numpy moved numpy.core -> numpy._core; take the function from ndarray's own reduce protocol.
_NUMPY_RECONSTRUCT = np.ndarray.__reduce__(np.zeros(1))[0]


def _latin1_encode(text, encoding="latin1", errors="strict"):
    """The only use of ``_codecs.encode`` in a protocol-2 pickle: str -> bytes via latin-1."""
    if not isinstance(text, str) or encoding.replace("-", "").lower() != "latin1":
        raise pickle.UnpicklingError(f"_codecs.encode with encoding {encoding!r} is not allowed")
    return text.encode("latin1", errors="strict")


class SparseState:
    """Inert stand-in for a pickled scipy sparse matrix: only records the state the pickle sets."""

    def __setstate__(self, state):
        if not isinstance(state, dict):
            raise pickle.UnpicklingError("sparse matrix state is not a dict")
        self.state = state


_SPARSE_MODULES = ("scipy.sparse.csr", "scipy.sparse._csr", "scipy.sparse")
_ALLOWED = {
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("numpy.core.multiarray", "_reconstruct"): _NUMPY_RECONSTRUCT,
    ("numpy._core.multiarray", "_reconstruct"): _NUMPY_RECONSTRUCT,
    ("collections", "defaultdict"): __import__("collections").defaultdict,
    ("__builtin__", "list"): list,
    ("builtins", "list"): list,
    ("_codecs", "encode"): _latin1_encode,
}
_ALLOWED.update({(m, "csr_matrix"): SparseState for m in _SPARSE_MODULES})


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, file, path):
        super().__init__(file, encoding="latin1")  # Python 2 pickles of numpy arrays need latin1
        self._path = path

    def find_class(self, module, name):
        obj = _ALLOWED.get((module, name))
        if obj is None:
            raise DataError(
                f"{self._path}: the pickle wants to load '{module}.{name}', which a Planetoid file never "
                "contains (refused; nothing was executed). Fix: use the original ind.* files from "
                "the Planetoid/GCN repositories; a file that imports other code may be malicious")
        return obj


def load(path) -> object:
    """Unpickle ``path`` with the restricted unpickler; any failure is a DataError naming the file."""
    try:
        with open(path, "rb") as f:
            return _RestrictedUnpickler(f, path).load()
    except DataError:
        raise
    except FileNotFoundError:
        raise DataError(f"{path}: file not found. Fix: point --root at the directory holding the "
                        "ind.<name>.{x,tx,allx,y,ty,ally,graph,test.index} files") from None
    except (EOFError, pickle.UnpicklingError, ValueError, TypeError, AttributeError, IndexError,
            KeyError, MemoryError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: not a readable Planetoid pickle ({type(exc).__name__}: {exc}); the "
                        "file is probably truncated or corrupted. Fix: copy the original file again") from None


def to_dense(obj, path) -> np.ndarray:
    """A float32 dense matrix from an unpickled ndarray or `SparseState` (validated)."""
    if isinstance(obj, SparseState):
        st = obj.state
        try:
            shape = tuple(int(x) for x in st.get("_shape", st.get("shape")))
            data, indices, indptr = (np.asarray(st[k]) for k in ("data", "indices", "indptr"))
            for arr in (data, indices, indptr):
                if arr.dtype == object:
                    raise ValueError("object arrays")
            mat = sp.csr_matrix((data, indices, indptr), shape=shape)
            mat.check_format(full_check=True)
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError(f"{path}: sparse matrix in the pickle is malformed ({exc}). "
                            "Fix: copy the original file again") from None
        return np.asarray(mat.toarray(), dtype=np.float32)
    if isinstance(obj, np.ndarray) and obj.dtype != object and obj.ndim == 2:
        return obj.astype(np.float32, copy=False)
    raise DataError(f"{path}: expected a 2-D matrix, found {type(obj).__name__}"
                    f"{getattr(obj, 'shape', '')}. Fix: check that the file is the right ind.* file")
