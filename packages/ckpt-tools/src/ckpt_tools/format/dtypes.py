"""Dtype names shared by the safetensors and DCP readers, without importing torch.

safetensors spells dtypes as short codes (`F32`, `BF16`); torch as `torch.float32`. Metadata commands
translate between the two from these tables alone.
"""

from __future__ import annotations

# safetensors code -> bytes per element
ITEMSIZE: dict[str, int] = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U64": 8,
    "U32": 4,
    "U16": 2,
    "U8": 1,
    "BOOL": 1,
}

# torch dtype name (without the `torch.` prefix) -> safetensors code
TORCH_TO_SAFETENSORS: dict[str, str] = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint64": "U64",
    "uint32": "U32",
    "uint16": "U16",
    "uint8": "U8",
    "bool": "BOOL",
}
SAFETENSORS_TO_TORCH: dict[str, str] = {code: name for name, code in TORCH_TO_SAFETENSORS.items()}

FLOATING = frozenset({"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"})

# The short spellings users type on the command line (`--dtype bf16`) and the torch names they stand
# for; both spellings are accepted wherever a floating dtype is chosen (ckpt convert, trainer flags).
SHORT_DTYPES: dict[str, str] = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "fp64": "float64"}
USER_DTYPES: dict[str, str] = {
    **{short: TORCH_TO_SAFETENSORS[name] for short, name in SHORT_DTYPES.items()},
    **{name: TORCH_TO_SAFETENSORS[name] for name in SHORT_DTYPES.values()},
}


def dtype_name(spelling: str) -> str | None:
    """The torch name (`bfloat16`) of a floating dtype spelled either way (`bf16`, `bfloat16`,
    `torch.bfloat16`, any case), or None when it is not one of them."""
    name = spelling.strip().lower().removeprefix("torch.")
    name = SHORT_DTYPES.get(name, name)
    return name if name in SHORT_DTYPES.values() else None


def safetensors_code(torch_dtype_name: str) -> str:
    """`torch.float32` or `float32` -> `F32`."""
    name = torch_dtype_name.removeprefix("torch.")
    try:
        return TORCH_TO_SAFETENSORS[name]
    except KeyError:
        raise ValueError(f"dtype {torch_dtype_name!r} has no safetensors equivalent") from None


def nbytes(code: str, shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count * ITEMSIZE[code]
