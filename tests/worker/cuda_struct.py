"""The fields of a C struct in a CUDA source, for the tests that hold a ctypes binding's
parameter block against the kernel's."""

from __future__ import annotations

import ctypes
import re

_SIZES = {"int32_t": 4, "int64_t": 8, "float": 4}


def struct_fields(source: str, name: str) -> list[tuple[str, int]]:
    """`struct <name> { ... };`'s (field, bytes) in order: pointers 8 bytes, the scalar
    types the kernels' blocks use."""
    body = re.search(rf"struct {name} \{{(.*?)\n\}};", source, re.S)
    assert body is not None, name
    fields: list[tuple[str, int]] = []
    for line in body.group(1).splitlines():
        decl = line.split("//")[0].strip().rstrip(";").removeprefix("const ")
        if not decl:
            continue
        kind, names = decl.split(" ", 1)
        size = 8 if kind.endswith("*") else _SIZES[kind]
        fields += [(field.strip(), size) for field in names.split(",")]
    return fields


def assert_matches(binding: type[ctypes.Structure], source: str, name: str) -> None:
    """The ctypes structure names the C struct's fields in order, with their sizes, and
    has no padding either side."""
    fields = struct_fields(source, name)
    assert fields == [(f[0], ctypes.sizeof(f[1])) for f in binding._fields_]
    assert ctypes.sizeof(binding) == sum(size for _, size in fields)
