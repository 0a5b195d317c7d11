"""`denpex doctor`: what this installation can do here, and why not where it cannot.

Read-only: it opens nothing for writing and changes no setting.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "doctor",
        help="check what denpex can see and use on this machine",
        description="Report the backends in use (compiled or pure Python), the signature "
        "catalog, and the host evidence `denpex run` can gather here (kernel log, cgroups).",
    )
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")
    parser.set_defaults(handler=handle)


def checks() -> list[tuple[str, bool, str]]:
    """(name, ok, detail) for every check, in a stable order."""
    import denpex._native as native
    from denpex import __version__
    from denpex.catalog import CatalogError, load_catalog
    from denpex.lite.hostwatch import CgroupMemoryWatch, KmsgWatch

    found: list[tuple[str, bool, str]] = [
        (
            "denpex",
            True,
            f"{__version__} on Python {platform.python_version()}"
            + (" (frozen)" if getattr(sys, "frozen", False) else ""),
        ),
    ]
    disabled = native.extensions_disabled()
    for name in native.NATIVE_MODULES:
        backend = native.backend(name)
        detail = backend + (" (DENPEX_NO_EXTENSIONS=1)" if disabled else "")
        if backend != "native" and not disabled:
            detail += ": not compiled; reinstall with a C compiler for full speed"
        found.append((f"backend {name}", backend == "native" or disabled, detail))
    try:
        catalog = load_catalog()
        found.append(("signatures", True, f"{len(catalog)} loaded ({catalog.backend} matcher)"))
    except CatalogError as exc:
        found.append(("signatures", False, exc.errors[0]))
    kmsg = KmsgWatch()
    readable = kmsg.open()
    kmsg.close()
    found.append(
        (
            "kernel log",
            readable,
            "readable: Xid, OOM-killer and other kernel lines during `denpex run` are evidence"
            if readable
            else f"{kmsg.unavailable}; run as root or set kernel.dmesg_restrict=0",
        )
    )
    cgroup = CgroupMemoryWatch(os.getpid())
    located = cgroup.locate()
    found.append(
        (
            "memory cgroup",
            located is not None,
            f"{located[0]} at {located[1]}: OOM kills of a job are counted"
            if located
            else "not found: cgroup OOM kills cannot be counted",
        )
    )
    return found


def handle(args: argparse.Namespace) -> int:
    from denpex.core import jsonio

    results = checks()
    if args.json:
        data = [{"check": n, "ok": ok, "detail": d} for n, ok, d in results]
        sys.stdout.buffer.write(jsonio.dumps(data, pretty=True) + b"\n")
    else:
        for name, ok, detail in results:
            print(f"{'ok  ' if ok else 'WARN'} {name:<18} {detail}")
    return 0
