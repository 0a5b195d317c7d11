"""PyInstaller hook for denpex: every submodule (many are imported lazily) and its data.

Data: the signature catalog, taxonomy and schemas, rules, thresholds, the CO-RE eBPF objects
and their layouts, the fake NVML source, report assets. Never collects Cython sources.
"""

from PyInstaller.utils.hooks import collect_data_files, collect_submodules

hiddenimports = collect_submodules("denpex")
datas = collect_data_files(
    "denpex",
    excludes=["**/*.pyx", "**/*.pyi", "**/*.c", "**/*.h", "**/*.inc", "**/__pycache__"],
) + collect_data_files("denpex", includes=["gpu/nvml/fake.h", "gpu/nvml/fake*.c"])
