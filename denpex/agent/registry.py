"""The one explicit list of collectors compiled into denpex (no plugin discovery, so the
frozen binary sees every one). Order is the order `denpex doctor` and `/metrics` list them.
"""

from __future__ import annotations

from denpex.core.collector import Collector
from denpex.fabric.gnmi import GnmiCollector
from denpex.fabric.gpudirect import GpuDirectCollector
from denpex.fabric.ib.collector import IbCollector
from denpex.fabric.nccl_topo.collector import NcclTopoCollector
from denpex.fabric.neighbours.collector import NeighboursCollector
from denpex.fabric.roce.collector import RoceCollector
from denpex.fabric.ufm.collector import UfmCollector
from denpex.gpu.dcgm.collector import DcgmCollector
from denpex.gpu.nvml.collector import NvmlCollector
from denpex.host.cgroup import CgroupCollector
from denpex.host.disk import DiskCollector
from denpex.host.ebpf.collector import EbpfCollector
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
    NeighboursCollector,
    GpuDirectCollector,
)
