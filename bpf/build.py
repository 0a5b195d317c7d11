"""Builds the CO-RE eBPF objects: vmlinux.h from the kernel's BTF, every bpf/*.bpf.c to an
object, and layouts.json (sizeof/offsetof of every struct in bpf/*.h) for the ctypes mirrors.

Run `python bpf/build.py [--out DIR]`; setup.py calls `build()` when the tools exist. It never
fails a package build: `missing()` names what is absent and the objects are then simply absent.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BPF_DIR = Path(__file__).resolve().parent
REPO = BPF_DIR.parent
DEFAULT_OUT = REPO / "denpex" / "host" / "bpf"
DEFAULT_BUILD = REPO / "build" / "bpf"
DEFAULT_BTF = Path("/sys/kernel/btf/vmlinux")
ARCH = {"x86_64": "x86", "aarch64": "arm64"}.get(os.uname().machine, "x86")

_STRUCT = re.compile(r"^struct\s+(\w+)\s*\{(.*?)^\};", re.M | re.S)
_FIELD = re.compile(r"^\s*[\w ]+?[\s*]+(\w+)\s*(?:\[[^\]]+\])?\s*;", re.M)


def missing(btf: Path = DEFAULT_BTF) -> str | None:
    """What the build lacks (None when it can run): clang, bpftool, a C compiler, BTF."""
    lacking = [tool for tool in ("clang", "bpftool") if shutil.which(tool) is None]
    if shutil.which(os.environ.get("CC", "cc")) is None:
        lacking.append("a host C compiler (cc)")
    if not btf.exists():
        lacking.append(f"kernel BTF ({btf})")
    return ", ".join(lacking) or None


def shared_headers() -> list[Path]:
    """The headers whose structs user space mirrors; `*.bpf.h` are kernel side only (maps
    and helpers several programs include) and cannot be compiled by the host C compiler."""
    return sorted(h for h in BPF_DIR.glob("*.h") if not h.name.endswith(".bpf.h"))


def struct_fields(header_text: str) -> dict[str, list[str]]:
    """The structs a header defines and their field names, in order (pure)."""
    return {
        name: _FIELD.findall(re.sub(r"/\*.*?\*/", "", body, flags=re.S))
        for name, body in _STRUCT.findall(header_text)
    }


def layout_program(headers: list[Path]) -> str:
    """C source that prints {"struct": {"size": n, "fields": {"f": [offset, size]}}} as JSON."""
    lines = ["#include <linux/types.h>", "#include <stddef.h>", "#include <stdio.h>"]
    lines += [f'#include "{h}"' for h in headers]
    lines += ["int main(void) {", '    printf("{");']
    structs = [(s, f) for h in headers for s, f in struct_fields(h.read_text()).items()]
    for i, (struct, fields) in enumerate(structs):
        sep = "," if i else ""
        lines.append(
            f'    printf("{sep}\\"{struct}\\": {{\\"size\\": %zu, \\"fields\\": {{", '
            f"sizeof(struct {struct}));"
        )
        for j, field in enumerate(fields):
            fsep = ", " if j else ""
            lines.append(
                f'    printf("{fsep}\\"{field}\\": [%zu, %zu]", offsetof(struct {struct}, {field}), '
                f"sizeof(((struct {struct} *)0)->{field}));"
            )
        lines.append('    printf("}}");')
    lines += ['    printf("}\\n");', "    return 0;", "}"]
    return "\n".join(lines) + "\n"


def write_layouts(headers: list[Path], out: Path) -> Path:
    cc = os.environ.get("CC", "cc")
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp, "layouts.c"), Path(tmp, "layouts")
        src.write_text(layout_program(headers))
        subprocess.run([cc, "-O0", "-o", str(exe), str(src)], check=True)
        text = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    target = out / "layouts.json"
    target.write_text(json.dumps(json.loads(text), indent=1, sort_keys=True) + "\n")
    return target


def vmlinux_header(build_dir: Path, btf: Path) -> Path:
    header = build_dir / "vmlinux.h"
    if not header.exists() or header.stat().st_mtime < btf.stat().st_mtime:
        text = subprocess.run(
            ["bpftool", "btf", "dump", "file", str(btf), "format", "c"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        header.write_text(text)
    return header


def build(
    out: Path = DEFAULT_OUT, build_dir: Path = DEFAULT_BUILD, btf: Path = DEFAULT_BTF
) -> list[Path]:
    """Compiles every program into `out` and writes layouts.json there; returns the paths."""
    out.mkdir(parents=True, exist_ok=True)
    build_dir.mkdir(parents=True, exist_ok=True)
    vmlinux_header(build_dir, btf)
    strip = shutil.which("llvm-strip")
    written = []
    for source in sorted(BPF_DIR.glob("*.bpf.c")):
        obj = out / source.name.replace(".bpf.c", ".bpf.o")
        cmd = ["clang", "-O2", "-g", "-target", "bpf", f"-D__TARGET_ARCH_{ARCH}"]
        cmd += ["-I", str(build_dir), "-I", str(BPF_DIR), "-c", str(source), "-o", str(obj)]
        subprocess.run(cmd, check=True)
        if strip:  # drop DWARF, keep .BTF/.BTF.ext (CO-RE needs them): ~600 kB -> ~10 kB
            subprocess.run([strip, "-g", str(obj)], check=True)
        written.append(obj)
    headers = shared_headers()
    written.append(write_layouts(headers, out))
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--build-dir", type=Path, default=DEFAULT_BUILD)
    parser.add_argument("--btf", type=Path, default=DEFAULT_BTF)
    args = parser.parse_args(argv)
    lacking = missing(args.btf)
    if lacking:
        print(f"eBPF objects not built: missing {lacking}", file=sys.stderr)
        return 2
    for path in build(args.out, args.build_dir, args.btf):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
