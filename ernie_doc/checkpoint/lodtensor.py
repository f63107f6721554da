"""Pure-numpy reader and writer of Paddle's one-file-per-variable LoDTensor format.

This is the layout of official static checkpoints (`fluid.io.save_vars` / `load_vars`, loaded
by `utils/init.py` of the official `ernie-doc/` code): one file, one tensor. The TensorDesc
protobuf is decoded and encoded by hand (varints only), so neither pickle nor the protobuf
package is needed. Byte layout: docs/design-notes.md, "Checkpoints: the LoDTensor format"."""
import math
import os
import struct
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from ernie_doc.errors import CheckpointError, LoDTensorFormatError
from ernie_doc.utils import atomic_path

# A file or directory path: str or pathlib.Path (a string: os.PathLike is subscriptable only
# from Python 3.9).
PathLike = Union[str, "os.PathLike[str]"]

# VarType.Type enum values used in TensorDesc.data_type.
BOOL, INT16, INT32, INT64, FP16, FP32, FP64 = 0, 1, 2, 3, 4, 5, 6
UINT8, INT8, BF16, COMPLEX64, COMPLEX128 = 20, 21, 22, 23, 24

_NUMPY_OF = {
    BOOL: np.dtype("bool"), INT16: np.dtype("<i2"), INT32: np.dtype("<i4"),
    INT64: np.dtype("<i8"), FP16: np.dtype("<f2"), FP32: np.dtype("<f4"),
    FP64: np.dtype("<f8"), UINT8: np.dtype("u1"), INT8: np.dtype("i1"),
    BF16: np.dtype("<u2"),  # raw bits; numpy has no bfloat16
    COMPLEX64: np.dtype("<c8"), COMPLEX128: np.dtype("<c16"),
}
# (kind, itemsize) → enum, byte order aside; bfloat16 has no numpy dtype to come from.
_ENUM_OF = {(dt.kind, dt.itemsize): code for code, dt in _NUMPY_OF.items() if code != BF16}
_ENUM_NAMES = {BOOL: "BOOL", INT16: "INT16", INT32: "INT32", INT64: "INT64", FP16: "FP16",
               FP32: "FP32", FP64: "FP64", UINT8: "UINT8", INT8: "INT8", BF16: "BF16",
               COMPLEX64: "COMPLEX64", COMPLEX128: "COMPLEX128"}

_MAX_DESC_BYTES = 1 << 16  # a TensorDesc is a few dozen bytes; more means a corrupt file
_MAX_LOD_LEVELS = 16


# -- protobuf varints ---------------------------------------------------------------------------
def encode_varint(value: int) -> bytes:
    """Non-negative int (negative int64 as two's complement, 10 bytes) → varint bytes."""
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def decode_varint(buf: bytes, pos: int) -> Tuple[int, int]:
    """Varint at buf[pos:] → (value as uint64, next pos). Raises ValueError if cut short."""
    result, shift = 0, 0
    while True:
        if pos >= len(buf):
            raise LoDTensorFormatError("varint runs past the end of the TensorDesc")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result & ((1 << 64) - 1), pos
        shift += 7
        if shift >= 70:
            raise LoDTensorFormatError("varint longer than 10 bytes")


def _as_int64(value):
    return value - (1 << 64) if value >= 1 << 63 else value


def encode_tensor_desc(data_type: int, dims: Sequence[int]) -> bytes:
    """TensorDesc bytes the way Paddle writes them: field 1 varint, then one field-2 varint
    per dim (unpacked)."""
    out = bytearray(b"\x08" + encode_varint(data_type))
    for d in dims:
        out += b"\x10" + encode_varint(int(d))
    return bytes(out)


def decode_tensor_desc(buf: bytes) -> Tuple[int, List[int]]:
    """TensorDesc bytes → (data_type, dims list). Unknown fields are skipped."""
    pos, data_type, dims = 0, None, []
    while pos < len(buf):
        key, pos = decode_varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = decode_varint(buf, pos)
            if field == 1:
                data_type = value
            elif field == 2:
                dims.append(_as_int64(value))
        elif wire == 2:
            length, pos = decode_varint(buf, pos)
            end = pos + length
            if end > len(buf):
                raise LoDTensorFormatError("length-delimited field runs past the end of the "
                                           "TensorDesc")
            if field == 2:  # packed dims
                while pos < end:
                    value, pos = decode_varint(buf, pos)
                    dims.append(_as_int64(value))
                if pos != end:
                    raise LoDTensorFormatError("packed dims overrun their length")
            pos = end
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise LoDTensorFormatError(f"unsupported protobuf wire type {wire} (field {field})")
        if pos > len(buf):
            raise LoDTensorFormatError("field runs past the end of the TensorDesc")
    if data_type is None:
        raise LoDTensorFormatError("TensorDesc has no data_type")
    return data_type, dims


# -- files --------------------------------------------------------------------------------------
def _read_exact(f, n, path, what):
    data = f.read(n)
    if len(data) != n:
        raise LoDTensorFormatError(
            f"{path}: truncated LoDTensor file: needed {n} bytes for {what}, found {len(data)}")
    return data


def bf16_to_fp32(bits: np.ndarray) -> np.ndarray:
    """uint16 bfloat16 bit patterns → float32 (exact)."""
    return (np.asarray(bits, dtype="<u2").astype("<u4") << 16).view("<f4")


def _read_header(f, path: str, size: int) -> Tuple[int, List[int], int]:
    """The header of the LoDTensor at `f` (a file of `size` bytes) → (data_type, dims, data
    bytes), `f` left at the data; every declared size is checked against the file first."""
    (version,) = struct.unpack("<I", _read_exact(f, 4, path, "the version"))
    if version != 0:
        raise LoDTensorFormatError(f"{path}: not a LoDTensor file (version {version}, "
                                   f"expected 0)")
    (lod_level,) = struct.unpack("<Q", _read_exact(f, 8, path, "the LoD level"))
    if lod_level > _MAX_LOD_LEVELS:
        raise LoDTensorFormatError(f"{path}: corrupt LoDTensor file (lod_level {lod_level})")
    for level in range(lod_level):
        (nbytes,) = struct.unpack("<Q", _read_exact(f, 8, path, f"LoD level {level} size"))
        if nbytes % 8:
            raise LoDTensorFormatError(
                f"{path}: corrupt LoDTensor file (LoD level {level} has {nbytes} bytes, "
                f"not a multiple of 8)")
        if nbytes > size - f.tell():
            raise LoDTensorFormatError(
                f"{path}: truncated or corrupt LoDTensor file: LoD level {level} declares "
                f"{nbytes} bytes, the file has {size - f.tell()} left")
        f.seek(nbytes, os.SEEK_CUR)   # the offsets are not needed
    (tversion,) = struct.unpack("<I", _read_exact(f, 4, path, "the tensor version"))
    if tversion != 0:
        raise LoDTensorFormatError(f"{path}: corrupt LoDTensor file (tensor version "
                                   f"{tversion}, expected 0)")
    (desc_len,) = struct.unpack("<i", _read_exact(f, 4, path, "the TensorDesc length"))
    if not 0 < desc_len <= _MAX_DESC_BYTES:
        raise LoDTensorFormatError(f"{path}: corrupt LoDTensor file (TensorDesc length "
                                   f"{desc_len})")
    desc = _read_exact(f, desc_len, path, "the TensorDesc")
    try:
        data_type, dims = decode_tensor_desc(desc)
    except ValueError as e:
        raise LoDTensorFormatError(f"{path}: corrupt TensorDesc: {e}") from None
    if data_type not in _NUMPY_OF:
        raise LoDTensorFormatError(f"{path}: unsupported data_type {data_type} in "
                                   f"TensorDesc")
    if any(d < 0 for d in dims):
        raise LoDTensorFormatError(f"{path}: corrupt TensorDesc (negative dim in {dims})")
    nbytes = math.prod(dims) * _NUMPY_OF[data_type].itemsize   # Python ints: no overflow
    available = size - f.tell()
    if available < nbytes:
        raise LoDTensorFormatError(
            f"{path}: truncated LoDTensor file: {_ENUM_NAMES[data_type]} {dims} needs "
            f"{nbytes} data bytes, found {available}")
    return data_type, dims, nbytes


def read_lodtensor(path: PathLike, upcast: bool = True) -> np.ndarray:
    """One LoDTensor file → np.ndarray (LoD discarded). upcast: FP16 / BF16 → float32, else
    float16 / raw uint16. Sizes are checked first: a corrupt header is a LoDTensorFormatError."""
    path = os.fspath(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise LoDTensorFormatError(f"{path}: empty file (0 bytes), not a LoDTensor file")
        data_type, dims, nbytes = _read_header(f, path, size)
        available = size - f.tell()
        if available > nbytes:
            raise LoDTensorFormatError(
                f"{path}: corrupt LoDTensor file: {available - nbytes} bytes after the "
                f"{_ENUM_NAMES[data_type]} {dims} data (a combined multi-tensor file?)")
        dtype = _NUMPY_OF[data_type]
        array = np.fromfile(f, dtype=dtype, count=math.prod(dims)).reshape(dims)
    if upcast and data_type == FP16:
        array = array.astype(np.float32)
    elif upcast and data_type == BF16:
        array = bf16_to_fp32(array)
    return array


def combined_shapes(path: PathLike) -> List[List[int]]:
    """The shapes of the tensors in a combined `.pdiparams` file, in file order, read from
    their headers alone (the data is never loaded)."""
    path = os.fspath(path)
    shapes = []
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        while f.tell() < size:
            _, dims, nbytes = _read_header(f, path, size)
            f.seek(nbytes, os.SEEK_CUR)
            shapes.append(dims)
    return shapes


def lodtensor_bytes_header(array: np.ndarray, data_type: Optional[int] = None) -> bytes:
    """The bytes that precede the data for `array` (lod_level 0)."""
    if data_type is None:
        data_type = dtype_enum(array.dtype)
    desc = encode_tensor_desc(data_type, array.shape)
    return struct.pack("<IQIi", 0, 0, 0, len(desc)) + desc


def dtype_enum(dtype) -> int:
    """numpy dtype → VarType enum (ValueError for types Paddle files cannot hold)."""
    dt = np.dtype(dtype)
    code = _ENUM_OF.get((dt.kind, dt.itemsize))
    if code is None:
        raise CheckpointError(f"dtype {dt} cannot be stored in a LoDTensor file")
    return code


def write_lodtensor(path: PathLike, array: np.ndarray) -> None:
    """Write `array` as one LoDTensor file (lod_level 0), atomically; bytes equal Paddle's."""
    array = np.asarray(array)
    data_type = dtype_enum(array.dtype)
    little = array.astype(array.dtype.newbyteorder("<"), copy=False) \
        if array.dtype.byteorder == ">" else array
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(lodtensor_bytes_header(array, data_type))
            np.ascontiguousarray(little).tofile(f)


# -- directories --------------------------------------------------------------------------------
def looks_like_lodtensor(path: PathLike) -> bool:
    """Files starting with a zero uint32 are taken as tensors (a config or vocab never does)."""
    with open(path, "rb") as f:
        return f.read(4) == b"\x00\x00\x00\x00"


def params_dir(directory: PathLike) -> str:
    """`directory/params` (the layout of released tarballs) when it exists and `directory`
    itself holds no tensor files, else `directory`."""
    directory = os.fspath(directory)
    sub = os.path.join(directory, "params")
    if os.path.isdir(sub) and not list_tensor_files(directory):
        return sub
    return directory


def list_regular_files(directory: PathLike) -> List[str]:
    """Names of the regular, non-hidden files of `directory`, sorted (FIFOs, devices and
    directories are left out: they are never opened)."""
    out = []
    for name in sorted(os.listdir(directory)):
        full = os.path.join(directory, name)
        if name.startswith(".") or name.endswith("~") or not os.path.isfile(full):
            continue  # hidden, editor or in-progress (".tmp-…") files
        out.append(name)
    return out


def list_tensor_files(directory: PathLike) -> List[str]:
    """Names of the regular, non-hidden files of `directory` that start like a LoDTensor."""
    return [name for name in list_regular_files(directory)
            if os.path.getsize(os.path.join(directory, name))
            and looks_like_lodtensor(os.path.join(directory, name))]


def read_official_dir(directory: PathLike, upcast: bool = True) -> Dict[str, np.ndarray]:
    """{file name: ndarray} for every LoDTensor file in `directory` (or its `params/`); other
    files are skipped, a LoDTensor file that fails to parse raises LoDTensorFormatError."""
    directory = params_dir(directory)
    return {name: read_lodtensor(os.path.join(directory, name), upcast=upcast)
            for name in list_tensor_files(directory)}


def write_official_dir(directory: PathLike, tensors: Dict[str, np.ndarray]) -> None:
    """Write {name: ndarray} as one LoDTensor file per name into `directory` (created if
    needed). Other files in the directory are left alone."""
    directory = os.fspath(directory)
    for name in tensors:
        if not name or os.sep in name or name.startswith(".") or (os.altsep and os.altsep in name):
            raise CheckpointError(f"{name!r} cannot be a file name in {directory}")
    os.makedirs(directory, exist_ok=True)
    for name, array in tensors.items():
        write_lodtensor(os.path.join(directory, name), array)
