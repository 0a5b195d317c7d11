"""A thin ctypes binding of libbpf.so.1 (1.1 API): open, load and attach CO-RE objects,
poll ring buffers, read and write maps. Never raises past `BpfError`, never blocks: ring
buffers are polled with a timeout the caller gives (the collector gives 0).
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

_PRINT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
_SAMPLE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
BPF_ANY, BPF_NOEXIST = 0, 1
K = TypeVar("K", bound="ctypes._CData")
V = TypeVar("V", bound="ctypes._CData")


class BpfError(RuntimeError):
    """A libbpf call failed; the message says which call, on what, and the kernel's reason."""


class UprobeOpts(ctypes.Structure):
    """struct bpf_uprobe_opts of libbpf 1.1 (sz first: libbpf checks it for compatibility)."""

    _fields_ = [
        ("sz", ctypes.c_size_t),
        ("ref_ctr_offset", ctypes.c_size_t),
        ("bpf_cookie", ctypes.c_uint64),
        ("retprobe", ctypes.c_bool),
        ("func_name", ctypes.c_char_p),
    ]


_SIGNATURES: dict[str, tuple[object, list[object]]] = {
    "libbpf_set_print": (ctypes.c_void_p, [_PRINT_FN]),
    "bpf_object__open_file": (ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_void_p]),
    "bpf_object__open_mem": (ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]),
    "bpf_object__load": (ctypes.c_int, [ctypes.c_void_p]),
    "bpf_object__close": (None, [ctypes.c_void_p]),
    "bpf_object__next_program": (ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_void_p]),
    "bpf_object__find_program_by_name": (ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]),
    "bpf_object__find_map_by_name": (ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]),
    "bpf_program__name": (ctypes.c_char_p, [ctypes.c_void_p]),
    "bpf_program__section_name": (ctypes.c_char_p, [ctypes.c_void_p]),
    "bpf_program__attach": (ctypes.c_void_p, [ctypes.c_void_p]),
    "bpf_program__attach_uprobe_opts": (
        ctypes.c_void_p,
        [ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_void_p],
    ),
    "bpf_link__destroy": (ctypes.c_int, [ctypes.c_void_p]),
    "bpf_map__fd": (ctypes.c_int, [ctypes.c_void_p]),
    "bpf_map_lookup_elem": (ctypes.c_int, [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]),
    "bpf_map_update_elem": (
        ctypes.c_int,
        [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64],
    ),
    "bpf_map_delete_elem": (ctypes.c_int, [ctypes.c_int, ctypes.c_void_p]),
    "bpf_map_get_next_key": (ctypes.c_int, [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]),
    "bpf_map_lookup_and_delete_elem": (
        ctypes.c_int,
        [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p],
    ),
    "ring_buffer__new": (
        ctypes.c_void_p,
        [ctypes.c_int, _SAMPLE_FN, ctypes.c_void_p, ctypes.c_void_p],
    ),
    "ring_buffer__poll": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int]),
    "ring_buffer__free": (None, [ctypes.c_void_p]),
    "ring_buffer__epoll_fd": (ctypes.c_int, [ctypes.c_void_p]),
}

_lib: ctypes.CDLL | None = None
_lib_lock = threading.Lock()
# libbpf's own diagnostics (verifier log, CO-RE failures), newest last, for error messages
_log: deque[str] = deque(maxlen=200)


def _print_to_log(level: int, fmt: bytes | None, args: int | None) -> int:
    buf = ctypes.create_string_buffer(2048)
    _libc.vsnprintf(buf, len(buf), fmt, ctypes.c_void_p(args))
    _log.append(buf.value.decode(errors="replace").rstrip())
    return 0


_libc = ctypes.CDLL(None)
_libc.vsnprintf.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_void_p]
_print_callback = _PRINT_FN(_print_to_log)  # kept alive for the life of the process


def libbpf(name: str = "libbpf.so.1") -> ctypes.CDLL:
    """The library with every signature set; raises OSError when it cannot be loaded."""
    global _lib
    with _lib_lock:
        if _lib is None:
            lib = ctypes.CDLL(name, use_errno=True)
            for func, (restype, argtypes) in _SIGNATURES.items():
                fn = getattr(lib, func)
                fn.restype = restype
                fn.argtypes = argtypes
            lib.libbpf_set_print(_print_callback)
            _lib = lib
    return _lib


def recent_log(lines: int = 8) -> str:
    """The last lines libbpf printed (the verifier's reason when a load fails)."""
    return " | ".join(list(_log)[-lines:])


def _fail(call: str, what: str, code: int | None = None) -> BpfError:
    err = abs(code) if code else ctypes.get_errno()
    reason = os.strerror(err) if err else "unknown error"
    log = recent_log(4)
    return BpfError(f"{call}({what}) failed: {reason}" + (f" [libbpf: {log}]" if log else ""))


class BpfMap:
    """One map of a loaded object, read and written through its fd with ctypes values."""

    def __init__(self, lib: ctypes.CDLL, name: str, fd: int) -> None:
        self._lib, self.name, self.fd = lib, name, fd

    def lookup(self, key: ctypes._CData, value: ctypes._CData) -> bool:
        return self._lib.bpf_map_lookup_elem(self.fd, ctypes.byref(key), ctypes.byref(value)) == 0

    def update(self, key: ctypes._CData, value: ctypes._CData, flags: int = BPF_ANY) -> None:
        rc = self._lib.bpf_map_update_elem(self.fd, ctypes.byref(key), ctypes.byref(value), flags)
        if rc < 0:
            raise _fail("bpf_map_update_elem", self.name, rc)

    def delete(self, key: ctypes._CData) -> bool:
        return self._lib.bpf_map_delete_elem(self.fd, ctypes.byref(key)) == 0

    def lookup_and_delete(self, key: ctypes._CData, value: ctypes._CData) -> bool:
        ref_k, ref_v = ctypes.byref(key), ctypes.byref(value)
        return self._lib.bpf_map_lookup_and_delete_elem(self.fd, ref_k, ref_v) == 0

    def keys(self, key_type: type[K]) -> Iterator[K]:
        """Every key (a snapshot walk: keys deleted meanwhile may restart the walk once)."""
        prev: K | None = None
        while True:
            nxt = key_type()
            prev_ref = ctypes.byref(prev) if prev is not None else None
            if self._lib.bpf_map_get_next_key(self.fd, prev_ref, ctypes.byref(nxt)) != 0:
                return
            yield nxt
            prev = nxt

    def items(self, key_type: type[K], value_type: type[V]) -> list[tuple[K, V]]:
        out = []
        for key in self.keys(key_type):
            value = value_type()
            if self.lookup(key, value):
                out.append((key, value))
        return out


class RingBuffer:
    """A ring buffer map; `poll(0)` hands every pending record's bytes to `on_record`."""

    def __init__(self, lib: ctypes.CDLL, bpf_map: BpfMap, on_record: Callable[[bytes], None]):
        def sample(_ctx: int | None, data: int | None, size: int) -> int:
            on_record(ctypes.string_at(data, size) if data else b"")
            return 0

        self._lib = lib
        self._callback = _SAMPLE_FN(sample)  # referenced so ctypes keeps it alive
        self._rb = lib.ring_buffer__new(bpf_map.fd, self._callback, None, None)
        if not self._rb:
            raise _fail("ring_buffer__new", bpf_map.name)

    def poll(self, timeout_ms: int = 0) -> int:
        n = self._lib.ring_buffer__poll(self._rb, timeout_ms)
        if n < 0 and -n != errno.EINTR:
            raise _fail("ring_buffer__poll", "ring buffer", n)
        return max(n, 0)

    def epoll_fd(self) -> int:
        """A descriptor that turns readable when records are waiting (for poll(2))."""
        return int(self._lib.ring_buffer__epoll_fd(self._rb))

    def free(self) -> None:
        if self._rb:
            self._lib.ring_buffer__free(self._rb)
            self._rb = None


class _OpenOpts(ctypes.Structure):
    """The head of struct bpf_object_open_opts (libbpf takes a shorter, older struct)."""

    _fields_ = [("sz", ctypes.c_size_t), ("object_name", ctypes.c_char_p)]


class BpfObject:
    """One opened and loaded .bpf.o with its links; `close()` detaches and unloads all.

    With `data` (the object's bytes, already checked: see signed.py) libbpf loads exactly
    those bytes, never the file again, so nothing can be swapped in between."""

    def __init__(self, path: Path, lib: ctypes.CDLL | None = None, data: bytes | None = None):
        self.path = path
        self._lib = lib or libbpf()
        self._links: list[int] = []
        self._rings: list[RingBuffer] = []
        if data is None:
            self._obj = self._lib.bpf_object__open_file(str(path).encode(), None)
        else:
            self._buffer = ctypes.create_string_buffer(data, len(data))
            self._opts = _OpenOpts(ctypes.sizeof(_OpenOpts), path.name.split(".")[0].encode())
            self._obj = self._lib.bpf_object__open_mem(
                self._buffer, len(data), ctypes.byref(self._opts)
            )
        if not self._obj:
            raise _fail(
                "bpf_object__open_file" if data is None else "bpf_object__open_mem", str(path)
            )
        rc = self._lib.bpf_object__load(self._obj)
        if rc < 0:
            self._lib.bpf_object__close(self._obj)
            self._obj = None
            raise _fail("bpf_object__load", path.name, rc)

    def program_names(self) -> list[str]:
        names, prog = [], self._lib.bpf_object__next_program(self._obj, None)
        while prog:
            names.append(self._lib.bpf_program__name(prog).decode())
            prog = self._lib.bpf_object__next_program(self._obj, prog)
        return names

    def _program(self, name: str) -> int:
        prog = self._lib.bpf_object__find_program_by_name(self._obj, name.encode())
        if not prog:
            raise BpfError(f"{self.path.name} has no program {name!r}")
        return int(prog)

    def attach(self, program: str) -> None:
        """Attaches by the program's section (tp_btf/..., raw_tp/...)."""
        link = self._lib.bpf_program__attach(self._program(program))
        if not link:
            raise _fail("bpf_program__attach", f"{self.path.name}:{program}")
        self._links.append(link)

    def attach_all(self) -> None:
        for name in self.program_names():
            self.attach(name)

    def attach_uprobe(
        self, program: str, binary: str, function: str, *, retprobe: bool, cookie: int = 0
    ) -> int:
        """Attaches to `function` of `binary` in every process (pid -1); returns the link."""
        opts = UprobeOpts(
            sz=ctypes.sizeof(UprobeOpts),
            bpf_cookie=cookie,
            retprobe=retprobe,
            func_name=function.encode(),
        )
        prog = self._program(program)
        link = self._lib.bpf_program__attach_uprobe_opts(
            prog, -1, binary.encode(), 0, ctypes.byref(opts)
        )
        if not link:
            raise _fail("bpf_program__attach_uprobe_opts", f"{binary}:{function}")
        self._links.append(link)
        return int(link)

    def map(self, name: str) -> BpfMap:
        m = self._lib.bpf_object__find_map_by_name(self._obj, name.encode())
        if not m:
            raise BpfError(f"{self.path.name} has no map {name!r}")
        return BpfMap(self._lib, name, self._lib.bpf_map__fd(m))

    def ring_buffer(self, name: str, on_record: Callable[[bytes], None]) -> RingBuffer:
        ring = RingBuffer(self._lib, self.map(name), on_record)
        self._rings.append(ring)
        return ring

    def close(self) -> None:
        for ring in self._rings:
            ring.free()
        for link in self._links:
            self._lib.bpf_link__destroy(link)
        self._links, self._rings = [], []
        if self._obj:
            self._lib.bpf_object__close(self._obj)
            self._obj = None
