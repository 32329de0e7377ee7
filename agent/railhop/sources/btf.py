"""A small reader of the kernel's BTF (``/sys/kernel/btf/vmlinux``): struct member offsets, enum
values, function and raw-tracepoint existence.

The BPF programs never dereference kernel structs through the (mismatched) kernel headers bcc
compiles against; the offsets they need come from here and reach the C code as ``-D`` flags.
Pure parsing of bytes: :func:`parse` takes the blob, so tests feed it hand-built BTF.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

from railhop.sources.base import SourceError

BTF_MAGIC = 0xEB9F
_HDR = struct.Struct("<HBBIIIII")
_TYPE = struct.Struct("<III")

KIND_INT = 1
KIND_PTR = 2
KIND_ARRAY = 3
KIND_STRUCT = 4
KIND_UNION = 5
KIND_ENUM = 6
KIND_FWD = 7
KIND_TYPEDEF = 8
KIND_VOLATILE = 9
KIND_CONST = 10
KIND_RESTRICT = 11
KIND_FUNC = 12
KIND_FUNC_PROTO = 13
KIND_VAR = 14
KIND_DATASEC = 15
KIND_FLOAT = 16
KIND_DECL_TAG = 17
KIND_TYPE_TAG = 18
KIND_ENUM64 = 19

_MODIFIERS = (KIND_TYPEDEF, KIND_VOLATILE, KIND_CONST, KIND_RESTRICT, KIND_TYPE_TAG)


class BTFError(SourceError):
    """The BTF blob is missing, malformed, or lacks a name the caller needs."""


@dataclass(frozen=True, slots=True)
class Member:
    name: str
    type_id: int
    bit_offset: int


@dataclass(slots=True)
class BtfType:
    kind: int
    name: str
    size_or_type: int
    kind_flag: bool
    vlen: int = 0
    members: list[Member] = field(default_factory=list)
    enum_values: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class Btf:
    """Parsed type table; ids start at 1 (``types[0]`` is the void placeholder)."""

    types: list[BtfType]
    by_name: dict[tuple[int, str], list[int]]

    def find(self, kind: int, name: str) -> int | None:
        ids = self.by_name.get((kind, name))
        return ids[0] if ids else None

    def has_func(self, name: str) -> bool:
        return self.find(KIND_FUNC, name) is not None

    def has_raw_tracepoint(self, name: str) -> bool:
        """Every kernel tracepoint ``name`` has a ``btf_trace_<name>`` typedef in vmlinux BTF."""
        return self.find(KIND_TYPEDEF, f"btf_trace_{name}") is not None

    def raw_tracepoint_nargs(self, name: str) -> int | None:
        """Number of TP_PROTO arguments of tracepoint ``name`` (None when unknown)."""
        tid = self.find(KIND_TYPEDEF, f"btf_trace_{name}")
        if tid is None:
            return None
        ptr = self._resolve(self.types[tid].size_or_type)
        if self.types[ptr].kind != KIND_PTR:
            return None
        proto = self._resolve(self.types[ptr].size_or_type)
        if self.types[proto].kind != KIND_FUNC_PROTO:
            return None
        return max(self.types[proto].vlen - 1, 0)  # the first parameter is the probe's data

    def _resolve(self, type_id: int) -> int:
        seen = 0
        while 0 < type_id < len(self.types) and self.types[type_id].kind in _MODIFIERS:
            type_id = self.types[type_id].size_or_type
            seen += 1
            if seen > 64:
                raise BTFError(f"type chain loop at id {type_id}")
        return type_id

    def member_offset(self, struct_name: str, member: str) -> int:
        """Byte offset of ``member`` in ``struct struct_name`` (looks into anonymous members)."""
        sid = self.find(KIND_STRUCT, struct_name)
        if sid is None:
            sid = self.find(KIND_UNION, struct_name)
        if sid is None:  # typedef struct { ... } name_t;
            tid = self.find(KIND_TYPEDEF, struct_name)
            if tid is not None:
                r = self._resolve(tid)
                if self.types[r].kind in (KIND_STRUCT, KIND_UNION):
                    sid = r
        if sid is None:
            raise BTFError(f"no struct {struct_name} in BTF")
        bits = self._member_bits(sid, member, 0)
        if bits is None:
            raise BTFError(f"struct {struct_name} has no member {member} in BTF")
        if bits % 8:
            raise BTFError(f"{struct_name}.{member} is a bitfield (bit offset {bits})")
        return bits // 8

    def _member_bits(self, type_id: int, member: str, depth: int) -> int | None:
        if depth > 8:
            return None
        t = self.types[type_id]
        for m in t.members:
            if m.name == member:
                return m.bit_offset
        for m in t.members:
            if m.name:
                continue
            inner = self._resolve(m.type_id)
            if self.types[inner].kind in (KIND_STRUCT, KIND_UNION):
                sub = self._member_bits(inner, member, depth + 1)
                if sub is not None:
                    return m.bit_offset + sub
        return None

    def enum_value(self, enum_name: str, value_name: str) -> int:
        for kind in (KIND_ENUM, KIND_ENUM64):
            for tid in self.by_name.get((kind, enum_name), []):
                vals = self.types[tid].enum_values
                if value_name in vals:
                    return vals[value_name]
        raise BTFError(f"no enum {enum_name} value {value_name} in BTF")


def _tail_len(kind: int, vlen: int) -> int:
    if kind in (KIND_INT, KIND_VAR, KIND_DECL_TAG):
        return 4
    if kind == KIND_ARRAY:
        return 12
    if kind in (KIND_STRUCT, KIND_UNION, KIND_DATASEC, KIND_ENUM64):
        return 12 * vlen
    if kind in (KIND_ENUM, KIND_FUNC_PROTO):
        return 8 * vlen
    return 0


def _name(strings: bytes, off: int) -> str:
    end = strings.find(b"\0", off)
    if off >= len(strings) or end < 0:
        raise BTFError(f"string offset {off} out of range")
    return strings[off:end].decode("ascii", "replace")


_INDEXED = (KIND_STRUCT, KIND_UNION, KIND_ENUM, KIND_ENUM64, KIND_FUNC, KIND_TYPEDEF)


def parse(blob: bytes) -> Btf:
    """Parse a raw BTF blob (little-endian, as the running x86_64/arm64 kernel exports it)."""
    if len(blob) < _HDR.size:
        raise BTFError("BTF blob shorter than its header")
    magic, _ver, _flags, hdr_len, type_off, type_len, str_off, str_len = _HDR.unpack_from(blob)
    if magic != BTF_MAGIC:
        raise BTFError(f"bad BTF magic {magic:#x}")
    t0 = hdr_len + type_off
    s0 = hdr_len + str_off
    if t0 + type_len > len(blob) or s0 + str_len > len(blob):
        raise BTFError("BTF sections run past the end of the blob")
    strings = blob[s0 : s0 + str_len]
    types: list[BtfType] = [BtfType(0, "", 0, False)]
    by_name: dict[tuple[int, str], list[int]] = {}
    pos, end = t0, t0 + type_len
    while pos < end:
        if pos + _TYPE.size > end:
            raise BTFError(f"truncated type record at byte {pos}")
        name_off, info, size_or_type = _TYPE.unpack_from(blob, pos)
        pos += _TYPE.size
        kind = (info >> 24) & 0x1F
        vlen = info & 0xFFFF
        kflag = bool(info >> 31)
        tail = _tail_len(kind, vlen)
        if pos + tail > end:
            raise BTFError(f"truncated type tail at byte {pos}")
        name = _name(strings, name_off) if kind in _INDEXED else ""
        t = BtfType(kind, name, size_or_type, kflag, vlen)
        if kind in (KIND_STRUCT, KIND_UNION):
            for i in range(vlen):
                m_name, m_type, m_off = _TYPE.unpack_from(blob, pos + 12 * i)
                bit_off = m_off & 0xFFFFFF if kflag else m_off
                t.members.append(Member(_name(strings, m_name), m_type, bit_off))
        elif kind == KIND_ENUM:
            for i in range(vlen):
                v_name, v_val = struct.unpack_from("<Ii", blob, pos + 8 * i)
                t.enum_values[_name(strings, v_name)] = v_val
        elif kind == KIND_ENUM64:
            for i in range(vlen):
                v_name, lo, hi = struct.unpack_from("<III", blob, pos + 12 * i)
                t.enum_values[_name(strings, v_name)] = (hi << 32) | lo
        pos += tail
        tid = len(types)
        types.append(t)
        if name and kind in _INDEXED:
            by_name.setdefault((kind, name), []).append(tid)
    return Btf(types, by_name)


def load(root: str = "/") -> Btf:
    """Parse ``<root>/sys/kernel/btf/vmlinux``; :class:`BTFError` when absent."""
    path = Path(root) / "sys/kernel/btf/vmlinux"
    try:
        blob = path.read_bytes()
    except OSError as e:
        raise BTFError(f"no BTF: cannot read {path}: {e.strerror}") from e
    return parse(blob)
