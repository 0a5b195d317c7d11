"""The one explicit list of collectors compiled into denpex (no plugin discovery, so the
frozen binary sees every one). Order is the order `denpex doctor` and `/metrics` list them.
"""

from __future__ import annotations

from denpex.core.collector import Collector
from denpex.fabric.gnmi import GnmiCollector
from denpex.fabric.gpudirect import GpuDirectCollector
from denpex.fabric.ib import IbCollector
from denpex.fabric.roce import RoceCollector
from denpex.fabric.topology import NcclTopoCollector
from denpex.fabric.ufm import UfmCollector
from denpex.gpu.dcgm import DcgmCollector
from denpex.gpu.nvml import NvmlCollector
from denpex.host.cgroup import CgroupCollector
from denpex.host.disk import DiskCollector
from denpex.host.ebpf import EbpfCollector
from denpex.host.journal import JournalCollector
from denpex.host.kmsg import KmsgCollector
from denpex.host.numa import NumaCollector
from denpex.host.pcie import PcieCollector
from denpex.host.proc import ProcCollector
from denpex.host.psi import PsiCollector

COLLECTORS: tuple[type[Collector], ...] = (
    KmsgCollector,
    JournalCollector,
    PsiCollector,
    CgroupCollector,
    ProcCollector,
    NumaCollector,
    DiskCollector,
    PcieCollector,
    EbpfCollector,
    NvmlCollector,
    DcgmCollector,
    UfmCollector,
    GnmiCollector,
    IbCollector,
    RoceCollector,
    NcclTopoCollector,
    GpuDirectCollector,
)
