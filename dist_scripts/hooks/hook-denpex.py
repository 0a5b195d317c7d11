"""PyInstaller hook for denpex: every submodule (many are imported lazily) and its data.

Data: the signature catalog, taxonomy and schemas, rules, thresholds, the CO-RE eBPF objects
and their layouts, the fake NVML source, report assets, the control plane's UI templates and
static files, and its Alembic migrations (Python files Alembic loads by path, so they ship as
source). The server's libraries are reached through import strings (uvicorn's protocols and
loops, SQLAlchemy's dialects), so their submodules are named here. Never collects Cython sources.
"""

from PyInstaller.utils.hooks import collect_data_files, collect_submodules

SERVER_PACKAGES = (
    "uvicorn",
    "alembic",
    "sqlalchemy.dialects.sqlite",
    "sqlalchemy.dialects.postgresql",
    "psycopg",
    "psycopg_binary",
)

hiddenimports = collect_submodules("denpex")
for package in SERVER_PACKAGES:
    hiddenimports += collect_submodules(package, on_error="ignore")

datas = (
    collect_data_files(
        "denpex",
        excludes=["**/*.pyx", "**/*.pyi", "**/*.c", "**/*.h", "**/*.inc", "**/__pycache__"],
    )
    + collect_data_files("denpex", includes=["gpu/nvml/fake.h", "gpu/nvml/fake*.c"])
    + collect_data_files(
        "denpex",
        include_py_files=True,
        includes=["control/migrations/*.py", "control/migrations/versions/*.py"],
    )
)
