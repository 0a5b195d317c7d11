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
        "catalog, the host evidence `denpex run` can gather here (kernel log, cgroups), and "
        "what the node agent can watch on this machine (kernel, BTF, BPF privileges, PSI, "
        "cgroup version, NVML, InfiniBand, every collector), each with the reason when not.",
    )
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")
    parser.set_defaults(handler=handle)


def checks() -> list[tuple[str, bool, str]]:
    """(name, ok, detail) for every check, in a stable order."""
    import denpex._native as native
    from denpex import __version__
    from denpex.catalog import CatalogError, load_catalog
    from denpex.core.roots import Roots
    from denpex.lite.hostwatch import kmsg_unavailable, memory_cgroup_of

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
    from denpex._native.linesearch import LONG_LINE, engine

    long_lines = engine() == "re2"
    found.append(
        (
            "long lines",
            long_lines,
            f"lines over {LONG_LINE} bytes are matched by RE2 (linear time)"
            if long_lines
            else "google-re2 is not installed: long lines use Python's re, which a crafted "
            "line can slow down (pip install google-re2)",
        )
    )
    try:
        catalog = load_catalog()
        found.append(("signatures", True, f"{len(catalog)} loaded ({catalog.backend} matcher)"))
    except CatalogError as exc:
        found.append(("signatures", False, exc.errors[0]))
    roots = Roots()
    kmsg_problem = kmsg_unavailable(roots)
    found.append(
        (
            "kernel log",
            kmsg_problem is None,
            "readable: Xid, OOM-killer and other kernel lines during `denpex run` are evidence"
            if kmsg_problem is None
            else kmsg_problem,
        )
    )
    memcg = memory_cgroup_of(roots, os.getpid())
    found.append(
        (
            "memory cgroup",
            memcg is not None,
            f"{memcg}: OOM kills of a job are counted"
            if memcg is not None
            else "not found: cgroup OOM kills cannot be counted",
        )
    )
    found.append(_sdk_check())
    found.extend(node_checks())
    return found


def _sdk_check() -> tuple[str, bool, str]:
    """Where the training SDK comes from: it runs inside the training process, with torch."""
    if getattr(sys, "frozen", False):
        return (
            "SDK",
            True,
            "not in this binary (torch is not frozen in); for denpex.sdk in training code, "
            "`pip install denpex` into the training environment",
        )
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return ("SDK", True, "torch not installed in this Python: denpex.sdk's hooks need it")
    return ("SDK", True, "denpex.sdk and torch importable here")


def node_checks() -> list[tuple[str, bool, str]]:
    """What the node agent can use here: the kernel's facilities and every collector."""
    from denpex.agent.registry import COLLECTORS
    from denpex.core.roots import Roots

    roots = Roots()
    found: list[tuple[str, bool, str]] = [("kernel", True, platform.release())]
    btf = roots.sys("kernel", "btf", "vmlinux")
    found.append(
        (
            "BTF",
            btf.exists(),
            f"{btf}: CO-RE eBPF programs load without kernel headers"
            if btf.exists()
            else "no /sys/kernel/btf/vmlinux: the kernel was built without BTF; eBPF is off",
        )
    )
    cap_bpf, cap_perfmon = _effective_caps(roots, (39, 38))
    privileged = os.geteuid() == 0 or (cap_bpf and cap_perfmon)
    found.append(
        (
            "BPF privileges",
            privileged,
            "root"
            if os.geteuid() == 0
            else ("CAP_BPF and CAP_PERFMON" if privileged else "needs root or CAP_BPF+CAP_PERFMON"),
        )
    )
    psi = [r for r in ("cpu", "memory", "io") if roots.proc("pressure", r).exists()]
    found.append(
        (
            "PSI",
            bool(psi),
            f"/proc/pressure: {', '.join(psi)}" if psi else "no /proc/pressure: boot with psi=1",
        )
    )
    cgroup_root = roots.cgroup()
    if (cgroup_root / "cgroup.controllers").exists():
        version = "v2 (unified)"
    elif (cgroup_root / "memory").is_dir():
        version = "v1" + (" (hybrid)" if (cgroup_root / "unified").is_dir() else "")
    else:
        version = ""
    found.append(("cgroups", bool(version), version or f"nothing mounted at {cgroup_root}"))
    found.append(_nvml_check())
    ib = roots.sys("class", "infiniband")
    ports = sorted(p.name for p in ib.iterdir()) if ib.is_dir() else []
    found.append(
        (
            "InfiniBand",
            bool(ports),
            ", ".join(ports) if ports else f"no devices under {ib} (fine on a node without IB)",
        )
    )
    for cls in COLLECTORS:
        try:
            collector = cls(roots, {})
            ok, reason = collector.available()
            collector.close()
        except Exception as exc:  # doctor reports, it never crashes
            ok, reason = False, f"{type(exc).__name__}: {exc}"
        found.append((f"collector {cls.name}", ok, f"[{cls.stability}] {reason}"))
    return found


def _effective_caps(roots, bits: tuple[int, ...]) -> list[bool]:
    try:
        text = roots.proc("self", "status").read_text()
        mask = int(next(x.split()[1] for x in text.splitlines() if x.startswith("CapEff:")), 16)
    except (OSError, StopIteration, ValueError):
        mask = 0
    return [bool(mask >> bit & 1) for bit in bits]


def _nvml_check() -> tuple[str, bool, str]:
    import ctypes

    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return "NVML", False, "libnvidia-ml.so.1 not found: no NVIDIA driver on this machine"
    return "NVML", True, "libnvidia-ml.so.1 loads"


def handle(args: argparse.Namespace) -> int:
    from denpex.core import jsonio

    results = checks()
    if args.json:
        data = [{"check": n, "ok": ok, "detail": d} for n, ok, d in results]
        sys.stdout.buffer.write(jsonio.dumps(data, pretty=True) + b"\n")
    else:
        for name, ok, detail in results:
            print(f"{'ok  ' if ok else 'WARN'} {name:<20} {detail}")
    return 0
