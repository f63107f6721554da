"""Reading `paddle.save` files (.pdparams / .pdopt) without running anything they contain.

Unpickling an untrusted pickle runs whatever callables it names, so PaddleNLP checkpoints are
never given to Python's or paddle's loaders: the opcodes are scanned first, then `find_class`
admits exactly what `paddle.save` writes, each checked by a function of ours. Anything else is
a CheckpointError naming the file. Details: docs/design-notes.md, "Checkpoints: the restricted
unpickler"."""
import _compat_pickle
import math
import os
import pickle
import pickletools
import struct
from collections import OrderedDict
from typing import Any, Dict

import numpy as np

from ernie_doc.checkpoint.lodtensor import PathLike
from ernie_doc.errors import CheckpointError
from ernie_doc.utils import open_regular

__all__ = ["load", "load_state_dict", "NAME_TABLE", "BIG_PARAM_INFO"]

# paddle.save adds these entries to a state dict: {key: paddle's generated name} and, for
# protocol 2/3 and tensors over 1 GiB, how a tensor was cut into slices `key@@.i`.
NAME_TABLE = "StructuredToParameterName@@"
BIG_PARAM_INFO = "UnpackBigParamInfor@@"  # sic: paddle's spelling

_MAX_DEPTH = 64          # a paddle state dict nests 3 deep; more is not one
_MAX_LINE = 1 << 16      # text arguments (GLOBAL names, INT, FLOAT) are short
# Byte-order characters of a dtype state and what they mean.
_BYTE_ORDERS = {"<": "<", ">": ">", "|": "=", "=": "="}
# The dtypes of paddle tensors, as numpy pickles them (np.dtype(...).str without byte order).
_DTYPES = {"b1", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8", "c8", "c16"}


class _Refused(Exception):
    """Raised inside the unpickler; load() turns it into a CheckpointError naming the file."""


# -- pass 1: the opcode scan ----------------------------------------------------------------
_REFUSED_OPS = {
    "PERSID": "persistent ids", "BINPERSID": "persistent ids",
    "EXT1": "the copyreg extension registry", "EXT2": "the copyreg extension registry",
    "EXT4": "the copyreg extension registry",
    "INST": "INST (build an object of a named class)", "OBJ": "OBJ (build an object)",
    "NEWOBJ": "NEWOBJ (build an object)", "NEWOBJ_EX": "NEWOBJ_EX (build an object)",
    "NEXT_BUFFER": "out-of-band buffers", "READONLY_BUFFER": "out-of-band buffers",
}
_COUNT_FORMATS = {pickletools.TAKEN_FROM_ARGUMENT1: "<B", pickletools.TAKEN_FROM_ARGUMENT4: "<i",
                  pickletools.TAKEN_FROM_ARGUMENT4U: "<I", pickletools.TAKEN_FROM_ARGUMENT8U: "<Q"}
_MEMO_PUTS = {"PUT", "BINPUT", "LONG_BINPUT"}


def _scan(f, size):
    """Walk the opcodes of the pickle in open file `f` (`size` bytes) without building
    anything; raise _Refused for what a paddle.save file never holds."""
    def take(n, what):
        if n > size - f.tell():
            raise _Refused(f"truncated or corrupt: {what} declares {n} bytes but only "
                           f"{size - f.tell()} remain")
        return f.read(n)

    head = f.read(2)
    if len(head) < 2 or head[0] != 0x80 or not 2 <= head[1] <= 5:
        raise _Refused("not a paddle.save file (it does not start like a pickle of protocol "
                       "2 or later)")
    count = 1
    while True:
        code = f.read(1)
        if not code:
            raise _Refused("truncated: the pickle ends before its STOP opcode")
        op = pickletools.code2op.get(code.decode("latin-1"))
        if op is None:
            raise _Refused(f"corrupt: byte 0x{code[0]:02x} at offset {f.tell() - 1} is no "
                           f"pickle opcode")
        if op.name in _REFUSED_OPS:
            raise _Refused(f"the pickle uses {_REFUSED_OPS[op.name]}, which a paddle state "
                           f"dict never does")
        count += 1
        arg = op.arg
        if arg is not None:
            if arg.n >= 0:
                raw = take(arg.n, op.name)
                if op.name in _MEMO_PUTS:
                    index = int.from_bytes(raw, "little")
                    if index > count:   # the C unpickler sizes its memo to the index
                        raise _Refused(f"corrupt: memo index {index} at opcode {count}")
                elif op.name == "FRAME":   # the frame's opcodes follow; its length must fit
                    frame = struct.unpack("<Q", raw)[0]
                    if frame > size - f.tell():
                        raise _Refused(f"truncated or corrupt: a frame declares {frame} bytes "
                                       f"but only {size - f.tell()} remain")
            elif arg.n == pickletools.UP_TO_NEWLINE:
                for _ in range(2 if op.name == "GLOBAL" else 1):
                    line = f.readline(_MAX_LINE)
                    if not line.endswith(b"\n"):
                        raise _Refused(f"truncated or corrupt: an unterminated {op.name} "
                                       f"argument")
                    if op.name == "PUT" and int(line) > count:
                        raise _Refused(f"corrupt: memo index {int(line)} at opcode {count}")
            else:
                fmt = _COUNT_FORMATS[arg.n]
                (n,) = struct.unpack(fmt, take(struct.calcsize(fmt), op.name))
                if n < 0:
                    raise _Refused(f"corrupt: negative length {n} in {op.name}")
                if n > size - f.tell():
                    raise _Refused(f"truncated or corrupt: {op.name} declares {n} bytes but "
                                   f"only {size - f.tell()} remain")
                f.seek(n, os.SEEK_CUR)   # the data itself is not needed here
        if op.name == "STOP":
            break
    if f.tell() != size:
        raise _Refused(f"corrupt: {size - f.tell()} bytes after the end of the pickle")


# -- pass 2: what the allowed globals become --------------------------------------------------
class _NdarraySentinel:
    """Stands for numpy.ndarray: valid only as _reconstruct's first argument."""


class _DTypeProxy:
    """A numpy dtype named by the pickle, checked; `.dtype` is the real one."""

    def __init__(self, name):
        self.name, self.order = name, "="

    def __setstate__(self, state):
        # numpy: (version, byte order, subarray, names, fields, elsize, alignment, flags[,
        # metadata]); a plain numeric dtype has no subarray, names or fields.
        if not (isinstance(state, tuple) and len(state) in (8, 9) and state[1] in _BYTE_ORDERS
                and state[2] is None and state[3] is None and state[4] is None
                and state[5] == -1 and state[6] == -1 and (len(state) == 8 or not state[8])):
            raise _Refused(f"a numpy dtype {self.name!r} with a state that no plain numeric "
                           f"dtype has ({_short(state)})")
        self.order = _BYTE_ORDERS[state[1]]

    @property
    def dtype(self):
        return np.dtype(self.name).newbyteorder(self.order)


class _ArrayProxy:
    """An ndarray named by the pickle; BUILD (its __setstate__) checks the state and makes
    `.array` with np.frombuffer (no numpy unpickling code sees the file's data)."""

    array = None

    def __setstate__(self, state):
        if not (isinstance(state, tuple) and len(state) == 5):
            raise _Refused(f"an ndarray with a malformed state ({_short(state)})")
        _, shape, dtype, fortran, raw = state
        if not isinstance(dtype, _DTypeProxy):
            raise _Refused(f"an ndarray whose dtype is {type(dtype).__name__}, not a numpy "
                           f"dtype")
        if not (isinstance(shape, tuple) and len(shape) <= 64
                and all(type(d) is int and d >= 0 for d in shape)):
            raise _Refused(f"an ndarray with shape {_short(shape)}")
        if isinstance(raw, str):   # protocol 0/1 or Python 2 text, read as latin-1
            raw = raw.encode("latin-1")
        if not isinstance(raw, (bytes, bytearray)):
            raise _Refused(f"an ndarray whose data is {type(raw).__name__}, not bytes")
        dt = dtype.dtype
        need = math.prod(shape) * dt.itemsize   # Python ints: cannot overflow
        if need != len(raw):
            raise _Refused(f"an ndarray of shape {list(shape)} and dtype {dt.name} needs "
                           f"{need} bytes, the pickle holds {len(raw)}")
        array = np.frombuffer(raw, dtype=dt).reshape(shape, order="F" if fortran else "C")
        if dt.byteorder not in ("=", "|"):
            array = array.astype(dt.newbyteorder("="))
        self.array = array


def _short(value, limit=80):
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _args(args, count, what):
    """The positional arguments a REDUCE passed, when there are `count` of them."""
    if len(args) != count:
        raise _Refused(f"{what} called with {len(args)} arguments ({_short(args)}), not the "
                       f"{count} paddle's pickles pass")
    return args


def _reconstruct(*args):
    """numpy's ndarray.__reduce__ calls _reconstruct(ndarray, (0,), b'b'): an empty array
    that BUILD then fills."""
    subtype, shape, code = _args(args, 3, "numpy _reconstruct")
    if subtype is not _NdarraySentinel or shape != (0,) or code not in (b"b", "b"):
        raise _Refused(f"numpy _reconstruct called with {_short(args)}, not numpy's own "
                       f"ndarray form")
    return _ArrayProxy()


def _dtype(*args):
    """numpy pickles a dtype as dtype(name, False, True) followed by BUILD."""
    name = _args(args, 3, "numpy.dtype")[0]
    if not isinstance(name, str) or name not in _DTYPES:
        raise _Refused(f"an array of dtype {_short(name)}, which a paddle state dict never "
                       f"contains")
    return _DTypeProxy(name)


def _scalar(*args):
    dtype, raw = _args(args, 2, "numpy scalar")
    if not isinstance(dtype, _DTypeProxy):
        raise _Refused(f"a numpy scalar of {type(dtype).__name__}")
    if isinstance(raw, str):
        raw = raw.encode("latin-1")
    dt = dtype.dtype
    if not isinstance(raw, bytes) or len(raw) != dt.itemsize:
        raise _Refused(f"a numpy {dt.name} scalar with {_short(raw)}")
    return np.frombuffer(raw, dtype=dt)[0].astype(dt.newbyteorder("="))


def _tensor_tuple(*args):
    """paddle: a dygraph Tensor pickles as (tuple, ((name, ndarray),)) → the array."""
    (pair,) = _args(args, 1, "builtins.tuple")
    if not (type(pair) is tuple and len(pair) == 2 and isinstance(pair[0], str)
            and isinstance(pair[1], _ArrayProxy)):
        raise _Refused(f"builtins.tuple called on {_short(pair)}, not paddle's "
                       f"(name, array) Tensor form")
    return pair[1]


def _dense_tensor(*args):
    """paddle: a static LoDTensor pickles as (eval, ('data', {'data': ndarray})) → the array.
    Nothing is evaluated: only that exact form is accepted."""
    if not (len(args) == 2 and args[0] == "data" and type(args[1]) is dict
            and list(args[1]) == ["data"] and isinstance(args[1]["data"], _ArrayProxy)):
        raise _Refused(f"builtins.eval called with {_short(args)}, not paddle's LoDTensor "
                       f"form (eval, ('data', {{'data': array}}))")
    return args[1]["data"]


def _latin1_bytes(*args):
    """Protocol 2 writes bytes as _codecs.encode(text, 'latin1')."""
    text, encoding = _args(args, 2, "_codecs.encode")
    if not (isinstance(text, str) and encoding in ("latin1", "latin-1")):
        raise _Refused(f"_codecs.encode called with encoding {_short(encoding)}, not the "
                       f"latin1 of protocol-2 bytes")
    return text.encode("latin-1")


def _ordered_dict(*args):
    if args:
        raise _Refused(f"collections.OrderedDict called with {_short(args)}")
    return OrderedDict()


_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy", "ndarray"): _NdarraySentinel,
    ("numpy", "dtype"): _dtype,
    ("numpy.core.multiarray", "scalar"): _scalar,
    ("numpy._core.multiarray", "scalar"): _scalar,
    ("builtins", "tuple"): _tensor_tuple,
    ("builtins", "eval"): _dense_tensor,
    ("_codecs", "encode"): _latin1_bytes,
    ("collections", "OrderedDict"): _ordered_dict,
}


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        # Protocol 2 writes Python 2 names (__builtin__.eval): read them as Python 3's, as
        # pickle itself does, so the allowlist and the messages use one spelling.
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        found = _ALLOWED.get((module, name))
        if found is None:
            raise _Refused(f"the pickle calls {module}.{name}, which a paddle state dict "
                           f"never contains")
        return found

    def persistent_load(self, pid):
        raise _Refused("the pickle uses persistent ids, which a paddle state dict never does")


def _resolve(obj, depth=0, seen=None):
    """Replace the proxies by numpy arrays / dtypes throughout the loaded structure."""
    if isinstance(obj, _ArrayProxy):
        if obj.array is None:
            raise _Refused("an ndarray without data")
        return obj.array
    if isinstance(obj, _DTypeProxy):
        return obj.dtype
    if obj is _NdarraySentinel:
        raise _Refused("a bare numpy.ndarray class in the data")
    if not isinstance(obj, (dict, list, tuple, set, frozenset)):
        return obj
    if depth > _MAX_DEPTH:
        raise _Refused(f"containers nested more than {_MAX_DEPTH} deep")
    seen = {} if seen is None else seen
    if id(obj) in seen:
        return seen[id(obj)]
    if isinstance(obj, dict):
        out = OrderedDict() if isinstance(obj, OrderedDict) else {}
        seen[id(obj)] = out
        for key, value in obj.items():
            if isinstance(key, (_ArrayProxy, _DTypeProxy)):
                raise _Refused("an array used as a dictionary key")
            out[key] = _resolve(value, depth + 1, seen)
        return out
    if isinstance(obj, list):
        out = []
        seen[id(obj)] = out
        out.extend(_resolve(v, depth + 1, seen) for v in obj)
        return out
    items = [_resolve(v, depth + 1, seen) for v in obj]
    out = type(obj)(items) if not isinstance(obj, tuple) else tuple(items)
    seen[id(obj)] = out
    return out


def load(path: PathLike) -> Any:
    """A paddle.save file → its object, tensors as read-only numpy arrays (bfloat16 as uint16
    bits). CheckpointError naming the file for anything paddle.save does not write."""
    path = os.fspath(path)
    with open_regular(path, "file", CheckpointError) as f:   # a FIFO would block open()
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise CheckpointError(f"{path}: empty file (0 bytes), not a paddle .pdparams/"
                                  f".pdopt file")
        try:
            _scan(f, size)
            f.seek(0)
            data = _RestrictedUnpickler(f, encoding="latin1").load()
            return _resolve(data)
        except _Refused as e:
            raise CheckpointError(f"{path}: refusing to load: {e}") from None
        except (MemoryError, RecursionError) as e:
            raise CheckpointError(f"{path}: refusing to load: the pickle needs more memory or "
                                  f"depth than a paddle state dict ({type(e).__name__})") \
                from None
        except Exception as e:  # noqa: BLE001  any unpickling failure of a damaged file
            raise CheckpointError(f"{path}: cannot read the pickle ({type(e).__name__}: "
                                  f"{e})") from None


def load_state_dict(path: PathLike) -> Dict[Any, Any]:
    """A paddle.save'd state dict → {key: numpy array}, the name table dropped and sliced
    tensors (over 1 GiB) put back together. CheckpointError when the file holds no dict."""
    path = os.fspath(path)
    state = load(path)
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: expected a state dict, the file holds a "
                              f"{type(state).__name__}")
    state = dict(state)
    state.pop(NAME_TABLE, None)
    info = state.pop(BIG_PARAM_INFO, None)
    if info is not None:
        _join_slices(path, state, info)
    return state


def _join_slices(path, state, info):
    """paddle's protocol-2/3 slicing: info = {key: {"OriginShape": shape, "slices": [keys]}},
    each slice a 1-D part of the flattened tensor."""
    if not isinstance(info, dict):
        raise CheckpointError(f"{path}: corrupt {BIG_PARAM_INFO} entry")
    for key, entry in info.items():
        ok = isinstance(entry, dict) and isinstance(entry.get("slices"), list) \
            and isinstance(entry.get("OriginShape"), (tuple, list))
        parts = [state.get(name) for name in entry["slices"]] if ok else []
        if not ok or not parts or not all(isinstance(p, np.ndarray) and p.ndim == 1
                                          for p in parts):
            raise CheckpointError(f"{path}: corrupt {BIG_PARAM_INFO} entry for {key!r}")
        shape = [int(d) for d in entry["OriginShape"]]
        if sum(p.size for p in parts) != math.prod(shape) or len({p.dtype for p in parts}) != 1:
            raise CheckpointError(f"{path}: the slices of {key!r} do not make its shape "
                                  f"{shape}")
        state[key] = np.concatenate(parts).reshape(shape)
        for name in entry["slices"]:
            state.pop(name, None)
