"""The cache sizes Eigen and oneDNN block their loops by: read, pin, imitate.

Eigen and oneDNN size their blocks from the cache sizes the CPU reports
through CPUID, which each reads once per process into a static variable:
Eigen's `manage_caching_sizes` (its L1 size decides how Eigen's matrix
products, and the convolutions built on them, split their sums, so it
decides bits) and oneDNN's `Xbyak::util::Cpu`. Neither an affinity mask nor
an ISA cap changes them.

This module finds those variables in TensorFlow's shared libraries through
their ELF symbol tables, initializes them as TensorFlow would if it has not
yet, checks their layout (Eigen's by its size, oneDNN's by this CPU's sizes
in it: a layout it does not know is refused, never overwritten), and then
either

- `pin`s Eigen's to one fixed geometry (the `eigen_cache_sizes` patch that
  `enable()` installs: every CPU then blocks Eigen's products alike), or
- `imitate`s another real CPU's sizes in both (`check --perturb caches`): the
  caches themselves are unchanged, and so is any code outside Eigen and
  oneDNN that reads CPUID; Eigen's sizes are left pinned where they are.

Eigen's float32 matmul, conv2d and its filter gradient add in another order
under another L1 size (oneDNN's custom ops off), and so does a
`mixed_bfloat16` Conv2D model with them on (bfloat16 products under the AVX2
cap are Eigen's); oneDNN's own float32 kernels do not follow the sizes
(docs/measurements.md, "Cache sizes, by imitation").
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import importlib.util
import json
import mmap
import os
import platform
import struct
from typing import Any

import numpy as np

from tfdet import _user_cache, _variables
from tfdet._pin._environment import cpu_caches

# The TensorFlow libraries that hold kernels (libtensorflow_cc) or framework
# code (libtensorflow_framework); each may hold its own copy of each variable.
_LIBRARIES = ("libtensorflow_cc.so.2", "libtensorflow_framework.so.2")
# Eigen: `static CacheSizes m_cacheSizes` in `manage_caching_sizes`, three
# ptrdiff_t (L1, L2, L3), its guard, the constructor that fills it, and the
# CPUID query it calls (to put this CPU's own sizes back after a pin).
_EIGEN = (
    "_ZZN5Eigen8internal20manage_caching_sizesENS_6ActionEPlS2_S2_E12m_cacheSizes",
    "_ZGVZN5Eigen8internal20manage_caching_sizesENS_6ActionEPlS2_S2_E12m_cacheSizes",
    "_ZN5Eigen8internal10CacheSizesC2Ev",
    "_ZN5Eigen8internal15queryCacheSizesERiS1_S1_",
)
# oneDNN: `static const Xbyak::util::Cpu cpu_` in `dnnl::impl::cpu::x64::cpu()`,
# whose data cache sizes are consecutive uint32 words, L1 first.
_ONEDNN = (
    "_ZZN4dnnl4impl3cpu3x643cpuEvE4cpu_",
    "_ZGVZN4dnnl4impl3cpu3x643cpuEvE4cpu_",
    "_ZN5Xbyak4util3CpuC2Ev",
)
_QUERY = _EIGEN[3]


@dataclasses.dataclass(frozen=True)
class Geometry:
    """The data cache sizes of a real CPU, in bytes."""

    name: str
    l1d: int
    l2: int
    l3: int

    def describe(self) -> str:
        """`Intel Xeon Sapphire Rapids (L1d 48K, L2 2048K, L3 307200K)`."""
        sizes = ", ".join(
            f"{label} {size // 1024}K"
            for label, size in (("L1d", self.l1d), ("L2", self.l2), ("L3", self.l3))
        )
        return f"{self.name} ({sizes})"

    def to_env(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_env(cls, text: str) -> Geometry:
        return cls(**json.loads(text))


K = 1024
# Real CPUs this project compared (lscpu on each); `others()` orders them
# for the `caches` imitation.
GEOMETRIES = (
    Geometry("Intel Xeon Sapphire Rapids", 48 * K, 2048 * K, 300 * K * K),
    Geometry("AMD EPYC Zen 4", 32 * K, 1024 * K, 32 * K * K),
    Geometry("AMD EPYC Zen 3", 32 * K, 512 * K, 32 * K * K),
    Geometry("AMD EPYC Zen 5", 48 * K, 1024 * K, 32 * K * K),
)


def _size(label: str) -> int | None:
    """This CPU's cache `label` ("L1d", "L2", "L3") in bytes, or None."""
    for entry in cpu_caches()[0]:
        name, _, size = entry.partition("=")
        if name == label and size[:-1].isdigit():
            unit = {"K": K, "M": K * K}.get(size[-1], 1)
            return int(size[:-1]) * unit
    return None


@functools.cache
def this_cpu() -> tuple[int | None, int | None]:
    """`(L1d, L2)` of this CPU in bytes, as the OS reports them (read once)."""
    return _size("L1d"), _size("L2")


def others() -> list[Geometry]:
    """The recorded geometries whose L1d or L2 differ from this CPU's, those
    with another L1d first: Eigen blocks its products by the L1d size, so a
    geometry that differs in L2 alone may leave their bits as they are
    (docs/explanation/what-decides-the-bits.md, "Cache sizes")."""
    l1d, l2 = this_cpu()
    differ = [g for g in GEOMETRIES if (g.l1d, g.l2) != (l1d, l2)]
    return sorted(differ, key=lambda geometry: geometry.l1d == l1d)


def _tensorflow_directory() -> str | None:
    """TensorFlow's package directory, found without importing it."""
    spec = importlib.util.find_spec("tensorflow")
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def _elf_symbols(path: str, names: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    """`{name: (st_value, st_size)}` for the `names` in an ELF64 file's symbols.

    Reads the section headers, then looks each name up in the string table
    of `.symtab` (all symbols), or of `.dynsym` (the exported ones) in a
    stripped file. Names declared together sit together in the string table
    (libtensorflow_cc's is 175 MB), so each search starts where the last one
    found its name.
    """
    found: dict[str, tuple[int, int]] = {}
    with (
        open(path, "rb") as handle,
        mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data,
    ):
        if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            return found  # Not a little-endian ELF64 file.
        (section_offset,) = struct.unpack_from("<Q", data, 0x28)
        entry_size, count = struct.unpack_from("<HH", data, 0x3A)
        sections = [
            struct.unpack_from("<IIQQQQIIQQ", data, section_offset + i * entry_size)
            for i in range(count)
        ]
        symbol_type = np.dtype(
            [
                ("name", "<u4"),
                ("info", "u1"),
                ("other", "u1"),
                ("shndx", "<u2"),
                ("value", "<u8"),
                ("size", "<u8"),
            ]
        )
        kinds = {section[1] for section in sections}
        kind_read = 2 if 2 in kinds else 11  # SHT_SYMTAB, else SHT_DYNSYM
        for _, kind, _, _, offset, size, link, *_ in sections:
            if kind != kind_read:
                continue
            start, end = sections[link][4], sections[link][4] + sections[link][5]
            cursor = start
            wanted = {}
            for name in names:
                needle = b"\0" + name.encode() + b"\0"
                at = data.find(needle, cursor, end)
                if at < 0:
                    at = data.find(needle, start, cursor + len(needle))
                if at >= 0:
                    wanted[at + 1 - start] = name
                    cursor = at
            if not wanted:
                continue
            # A view of the mapped file, not a copy (the table of
            # libtensorflow_cc is 28 MB); only the matches outlive the map.
            table = np.frombuffer(
                data,
                dtype=symbol_type,
                count=size // symbol_type.itemsize,
                offset=offset,
            )
            matches = table[np.isin(table["name"], list(wanted))].copy()
            del table
            for entry in matches:
                if entry["value"]:
                    found[wanted[int(entry["name"])]] = (
                        int(entry["value"]),
                        int(entry["size"]),
                    )
    return found


@functools.cache
def library_symbols(
    names: tuple[str, ...], libraries: tuple[str, ...] = _LIBRARIES
) -> dict[str, dict[str, tuple[int, int]]]:
    """`{library path: {symbol: (st_value, st_size)}}` of `names` in
    TensorFlow's `libraries` (read once per process and set of names)."""
    directory = _tensorflow_directory()
    if directory is None:
        return {}
    found = {}
    for library in libraries:
        path = os.path.realpath(os.path.join(directory, library))
        if os.path.exists(path):
            found[path] = _kept_symbols(path, names)
    return found


def _kept_symbols(path: str, names: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    """`_elf_symbols`, kept in tfdet's cache per file and names.

    Searching libtensorflow_cc's 175 MB string table took 0.1-0.15 s of CPU
    (2-core EPYC Zen 3) in every process that `enable()` pins, and in every
    `tfdet check`. The key is the file's identity (device, inode, size,
    modification time) and the names, so a TensorFlow installed again is
    read again. What is read back is only trusted as far as a fresh read
    would be: `_locations` checks each variable's layout before writing it.
    """
    status = os.stat(path)
    identity = [path, status.st_dev, status.st_ino, status.st_size]
    identity += [status.st_mtime_ns, sorted(names)]
    key = hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:32]
    kept_at = _user_cache.directory() / "symbols" / f"{key}.json"
    kept = _user_cache.read_json(kept_at)
    if (
        isinstance(kept, dict)
        and set(kept) <= set(names)
        and all(
            isinstance(pair, list)
            and len(pair) == 2
            and all(isinstance(number, int) and number >= 0 for number in pair)
            for pair in kept.values()
        )
    ):
        return {name: (pair[0], pair[1]) for name, pair in kept.items()}
    found = _elf_symbols(path, names)
    _user_cache.write_json(kept_at, found)
    return found


def symbols_found(
    names: tuple[str, ...], libraries: tuple[str, ...] = _LIBRARIES
) -> bool:
    """Whether one of TensorFlow's `libraries` names all of `names`."""
    return any(
        set(names) <= set(found) for found in library_symbols(names, libraries).values()
    )


def pin_unavailable() -> str | None:
    """None where `pin` can work here, else why not."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return (
            "only on Linux x86-64 (Eigen's cache sizes in TensorFlow's ELF libraries)"
        )
    if this_cpu()[0] is None:
        return "the OS does not report this CPU's L1d size"
    if not symbols_found(_EIGEN):
        return (
            "this TensorFlow build's libraries do not name Eigen's cache-size "
            "variable in a symbol table (a stripped build?)"
        )
    return None


def imitation_unavailable() -> str | None:
    """None where `imitate` can work here, else why not (for the report)."""
    reason = pin_unavailable()
    if reason is not None:
        return reason
    if None in this_cpu():
        return "the OS does not report this CPU's L2 size"
    if not others():
        return "no recorded CPU geometry differs from this CPU's"
    if not symbols_found(_ONEDNN):
        return (
            "this TensorFlow build's libraries do not name oneDNN's CPU "
            "description in a symbol table"
        )
    return None


class ImitationError(RuntimeError):
    """The variables did not hold this CPU's sizes: nothing was written."""


@functools.cache
def load_address(path: str) -> int:
    """Where `path` is mapped in this process (its offset-0 mapping).

    Read once per library: a loaded library does not move (a library not
    loaded yet raises, and raising is not cached).
    """
    with open("/proc/self/maps", encoding="utf-8") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and fields[5] == path and int(fields[2], 16) == 0:
                return int(fields[0].split("-")[0], 16)
    raise ImitationError(
        f"Expected {path} to be loaded. It is not mapped in this process."
    )


def _initialized(
    base: int, symbols: dict[str, tuple[int, int]], names: tuple
) -> tuple[int, int]:
    """`(address, size)` of a function-local static, constructed as its
    function would construct it if it has not been yet."""
    variable, guard, constructor = names[:3]
    address, size = base + symbols[variable][0], symbols[variable][1]
    guard_byte = ctypes.c_uint8.from_address(base + symbols[guard][0])
    if not guard_byte.value:
        ctypes.CFUNCTYPE(None, ctypes.c_void_p)(base + symbols[constructor][0])(address)
        # The Itanium C++ ABI: a nonzero first byte marks the static as built.
        guard_byte.value = 1
    return address, size


def _locations(which: tuple) -> list[tuple[str, int, int]]:
    """`(library name, address, size)` of each loaded copy of `which`, built."""
    found = []
    for path, symbols in library_symbols(which).items():
        if set(which) <= set(symbols):
            address, size = _initialized(load_address(path), symbols, which)
            found.append((os.path.basename(path), address, size))
    if not found:
        raise ImitationError(
            f"Expected {which[0]} in TensorFlow's libraries. Found no copy."
        )
    return found


# The geometry `pin` wrote into Eigen's sizes, while it is in force.
_pinned: Geometry | None = None
# Eigen's `CacheSizes`: three ptrdiff_t, L1 first.
_EIGEN_FIELDS = ctypes.c_int64 * 3


def _eigen_copies() -> list[tuple[str, Any]]:
    """`(library name, sizes)` of every loaded copy of Eigen's cached sizes.

    Raises:
        ImitationError: a copy is not the three-integer struct this module
            knows (its symbol has another size); nothing is written then.
    """
    copies = []
    for library, address, size in _locations(_EIGEN):
        if size != ctypes.sizeof(_EIGEN_FIELDS):
            raise ImitationError(
                f"Expected Eigen's cache sizes in {library} to take "
                f"{ctypes.sizeof(_EIGEN_FIELDS)} bytes. Received: {size}; "
                "not overwritten."
            )
        copies.append((library, _EIGEN_FIELDS.from_address(address)))
    return copies


def eigen_sizes() -> tuple[int, int, int]:
    """Eigen's cached `(L1, L2, L3)` in this process (of its first copy)."""
    return tuple(_eigen_copies()[0][1])


def pin(geometry: Geometry | None) -> None:
    """Writes `geometry` into every copy of Eigen's cached sizes.

    None puts back this CPU's own sizes (Eigen's CPUID query, run anew).
    Eigen reads the sizes at each matrix product, so a pin holds from the
    next one on. Loads TensorFlow's libraries if they are not yet.

    Raises:
        ImitationError: Eigen's sizes are not where or what this module
            expects; nothing is written.
    """
    global _pinned
    import tensorflow  # noqa: F401  (loads the libraries that hold the sizes)

    copies = _eigen_copies()
    if geometry is None:
        l1, l2, l3 = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        _query(l1, l2, l3)
        values = [l1.value, l2.value, l3.value]
    else:
        values = [geometry.l1d, geometry.l2, geometry.l3]
    for _, sizes in copies:
        sizes[:] = values
    _pinned = geometry


class _Pin:
    """`pin` as one attribute, so that a patch's `Swap` can set and undo it."""

    @property
    def geometry(self) -> Geometry | None:
        """The geometry Eigen's sizes are pinned to (None: the CPU's own)."""
        return _pinned

    @geometry.setter
    def geometry(self, value: Geometry | None) -> None:
        pin(value)


PIN = _Pin()


def _query(l1: ctypes.c_int, l2: ctypes.c_int, l3: ctypes.c_int) -> None:
    """Eigen's own CPUID query (`Eigen::internal::queryCacheSizes`)."""
    for path, symbols in library_symbols(_EIGEN).items():
        if _QUERY in symbols:
            pointer = ctypes.POINTER(ctypes.c_int)
            function = ctypes.CFUNCTYPE(None, pointer, pointer, pointer)
            address = load_address(path) + symbols[_QUERY][0]
            function(address)(ctypes.byref(l1), ctypes.byref(l2), ctypes.byref(l3))
            return
    raise ImitationError(f"Expected {_QUERY} in TensorFlow's libraries. Found none.")


# Where, in each copy of oneDNN's CPU description, the data cache sizes start.
_onednn_starts: dict[int, int] = {}


def _onednn_start(address: int, words: Any) -> int:
    """Index of the L1d size among the words of oneDNN's CPU description.

    Found once per copy, as the one place holding this CPU's L1d and L2
    sizes side by side (so a second imitation finds it again).

    Raises:
        ImitationError: not exactly one such place; nothing is written.
    """
    if address not in _onednn_starts:
        own = this_cpu()
        starts = [
            index
            for index in range(len(words) - 2)
            if tuple(words[index : index + 2]) == own
        ]
        if len(starts) != 1:
            raise ImitationError(
                "Expected oneDNN's CPU description to hold this CPU's L1d and "
                f"L2 sizes {own} once. Found them {len(starts)} times; not "
                "overwritten."
            )
        _onednn_starts[address] = starts[0]
    return _onednn_starts[address]


def imitate(geometry: Geometry) -> list[str]:
    """Makes Eigen and oneDNN in this process see `geometry`'s cache sizes.

    What a CPU reporting those sizes through CPUID would give: Eigen's sizes
    are left alone where `pin` fixed them. Call after `import tensorflow`
    and before the first matrix product or oneDNN primitive of the run
    (blocks sized before are not redone).

    Returns:
        What was rewritten or left pinned, one line each.

    Raises:
        ImitationError: a variable is missing or not laid out as expected
            (oneDNN's must hold this CPU's L1d and L2 sizes once); nothing of
            that variable was written.
    """
    done = []
    for library, sizes in _eigen_copies():
        if _pinned is not None:
            done.append(f"Eigen in {library}: pinned by tfdet, left alone")
            continue
        sizes[:] = [geometry.l1d, geometry.l2, geometry.l3]
        done.append(f"Eigen in {library}")
    for library, address, size in _locations(_ONEDNN):
        words = (ctypes.c_uint32 * (size // 4)).from_address(address)
        start = _onednn_start(address, words)
        words[start : start + 3] = [geometry.l1d, geometry.l2, geometry.l3]
        done.append(f"oneDNN in {library}")
    return done


def imitate_if_requested() -> list[str]:
    """`imitate` the geometry `IMITATE_CACHES` names; nothing when unset."""
    text = os.environ.get(_variables.IMITATE_CACHES)
    if not text:
        return []
    import tensorflow  # noqa: F401  (loads the libraries that hold the variables)

    return imitate(Geometry.from_env(text))
