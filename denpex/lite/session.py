"""One analysis of one job or one set of logs: scanner + host evidence + diagnosis + reports.

It is what runs inside the analyzer process of `denpex run` and in `denpex scan`. It only
reads what it is fed and writes the reports it was asked for; it never touches the child.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from denpex.catalog import Catalog
from denpex.core import jsonio
from denpex.core.diagnosis import Diagnosis
from denpex.core.roots import Roots
from denpex.core.wire import Registration
from denpex.diagnosis import DiagnosisInput, diagnose
from denpex.lite.agent_link import AgentLink, job_name
from denpex.lite.hostwatch import RunHostWatch
from denpex.lite.job_watch import JobWatch
from denpex.lite.run_facts import run_facts, start_board_lookup
from denpex.lite.scan_input import InputNotes, LongLineTails, follow, read_all
from denpex.lite.scanner import LINE_CAP, Scanner, ScanPart
from denpex.lite.sdk_channel import SdkListener

log = logging.getLogger("denpex.lite.session")

if TYPE_CHECKING:
    from denpex.gpu.nvml.boards import BoardLookup
    from denpex.retrieval.index import Hit

STREAM_NAMES = {1: "stdout", 2: "stderr"}


@dataclass(slots=True)
class ReportOptions:
    """Where the diagnosis goes: human text on stderr, JSON and/or HTML files, JSON on stdout."""

    report_path: str | None = None
    html_path: str | None = None
    json_stdout: bool = False
    text: bool = True
    color: bool | None = None  # None: colour when stderr is a terminal
    title: str = "denpex diagnosis"
    # called with the diagnosis JSON and the run's facts (denpex.lite.run_facts) after the
    # outputs above (the control-plane client)
    sinks: list[Callable[[dict, dict], None]] = field(default_factory=list)
    command: tuple[str, ...] = ()  # the wrapped command (`denpex run`): the workload's name
    # past incidents for the retrieval block: (query, vector, k) → hits (the control plane)
    incidents: Callable[[str, Any, int], Sequence[Hit]] | None = None


@dataclass(slots=True)
class SessionPart:
    """What a session read of its inputs, each closed (LiteSession.part → absorb)."""

    scan: ScanPart
    inputs: InputNotes
    tails: list[LongLineTails]


class LiteSession:
    """Feeds bytes to a Scanner, gathers host evidence for a child, writes the diagnosis."""

    def __init__(
        self,
        catalog: Catalog,
        options: ReportOptions,
        *,
        host: str | None = None,
        host_watch: RunHostWatch | None = None,
        child_pid: int | None = None,
        sdk: SdkListener | None = None,
    ) -> None:
        self.catalog = catalog
        self.options = options
        self.scanner = Scanner(catalog, default_host=host)
        self.diagnosis: Diagnosis | None = None
        self.child_pid = child_pid
        self.notes: list[str] = list(host_watch.notes) if host_watch else []
        self.host_watch = host_watch
        self.job: JobWatch | None = None
        if host_watch is not None or child_pid:
            self.job = JobWatch(self.scanner, host_watch, child_pid)
        self.agent: AgentLink | None = None
        # the analyzer builds its session after loading the catalog, often after a short job
        # has died: what the agent saw counts from the job's start, not from here
        self.agent_since_ns = host_watch.started_ns if host_watch else time.time_ns()
        self.sdk = sdk  # the job's SDK socket (`denpex run`), read on every tick
        self.boards: BoardLookup | None = None  # the GPUs' serials, for a shipped report
        self.inputs = InputNotes()
        self._tails: dict[str, LongLineTails] = {}
        self._retrieval_ready: threading.Thread | None = None  # the model loading meanwhile

    @classmethod
    def for_run(
        cls,
        catalog: Catalog,
        options: ReportOptions,
        child_pid: int | None,
        host_watch: RunHostWatch | None,
        sdk: SdkListener | None = None,
    ) -> LiteSession:
        """The session of a wrapped job on this host (`host_watch` was opened before it ran);
        the job is registered with the node agent when one is running here."""
        session = cls(
            catalog,
            options,
            host=socket.gethostname(),
            host_watch=host_watch,
            child_pid=child_pid,
            sdk=sdk,
        )
        if options.sinks and host_watch is not None:  # read while the job runs, not at its end
            session.boards = start_board_lookup(host_watch.roots)
        link = AgentLink.from_env()
        if child_pid and link is not None:
            registration = Registration(
                pid=child_pid, job=job_name(child_pid), started_ns=session.agent_since_ns
            )
            if link.register(registration):
                session.agent = link
            elif link.reason and not link.reason.startswith("no agent on"):
                # an agent runs here but refused the job: its evidence is missing, say why
                session.notes.append(f"node agent evidence not included: {link.reason}")
        return session

    # -- input ---------------------------------------------------------------------------
    def _scan(self, name: str, data: bytes, *, gap: bool = False, arrival_ns: int | None = None):
        """Scan a chunk of stream `name`, and the tails of its lines past the scanner's cap."""
        scanner = self.scanner
        before = scanner.truncated_bytes
        scanner.feed(name, data, gap=gap, arrival_ns=arrival_ns)
        tails = self._tails.get(name)
        if tails is None:
            tails = self._tails[name] = LongLineTails(LINE_CAP)
        if gap:
            tails.length, tails.tail = 0, bytearray()
        self._scan_tails(name, tails.feed(data, scanner.truncated_bytes > before), arrival_ns)

    def _scan_tails(self, name: str, tails: list[bytes], arrival_ns: int | None = None) -> None:
        if not tails:
            return
        state = self.scanner.stream(name)
        tail_name = f"{name} (ends of long lines)"
        self.scanner.stream(tail_name, host=state.host, rank=state.rank, source=state.source)
        self.scanner.feed(tail_name, b"\n".join(tails) + b"\n", arrival_ns=arrival_ns)

    def scan_file(self, path: str, *, host: str | None = None, rank: int | None = None) -> None:
        """Scan a whole file (OSError when it cannot be read)."""
        self.scanner.stream(path, host=host, rank=rank)
        with open(path, "rb") as handle:
            read_all(path, handle, lambda chunk: self._scan(path, chunk), self.inputs)

    def part(self) -> SessionPart:
        """Everything this session read, each stream read to its end and closed (the ends of
        its long lines scanned, its series judged), for another session to absorb."""
        for name, tails in self._tails.items():
            self._scan_tails(name, tails.flush())
        return SessionPart(self.scanner.part(), self.inputs, list(self._tails.values()))

    def absorb(self, part: SessionPart) -> None:
        """Take what another session read, as if it had been read here after what was."""
        self.scanner.absorb(part.scan)
        self.inputs.empty.extend(part.inputs.empty)
        self.inputs.binary.extend(part.inputs.binary)
        self.inputs.total_bytes += part.inputs.total_bytes
        for tails in part.tails:  # flushed: counted at the end, never fed again
            self._tails[f"{len(self._tails)} (absorbed)"] = tails
        # the model loads while the other files are read (scan_files forked its workers
        # before the first part came back: the thread is never forked)
        self._prepare_retrieval(part.scan.evidence)

    def scan_fd(
        self, name: str, fd: int, *, host: str | None = None, rank: int | None = None
    ) -> None:
        """Scan a descriptor (stdin) to its end."""
        self.scanner.stream(name, host=host, rank=rank)
        read_all(name, fd, lambda chunk: self._scan(name, chunk), self.inputs)

    def follow(self, path: str, *, host: str | None = None, rank: int | None = None) -> None:
        """Scan a growing file until SIGINT or SIGTERM, printing each failure as it appears."""
        self.scanner.stream(path, host=host, rank=rank)
        stop = {"now": False}

        def request_stop(signum: int, frame: object) -> None:
            stop["now"] = True

        previous = {s: signal.signal(s, request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
        shown = [0]

        def feed(chunk: bytes) -> None:
            self.inputs.total_bytes += len(chunk)
            self._scan(path, chunk)
            shown[0] = self._print_new_failures(shown[0])

        try:
            follow(path, feed, lambda: stop["now"])
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if self.inputs.total_bytes == 0:
            self.inputs.empty.append(path)

    def _print_new_failures(self, already: int) -> int:
        evidence = self.scanner.evidence
        for item in evidence[already:]:
            if item.is_failure and self.options.text:
                event = item.event
                rank = f"r{event.rank}" if event.rank is not None else ""
                where = " ".join(p for p in (event.host or "", rank) if p)
                print(
                    f"denpex: [{item.id}] {item.category} {where}: {item.summary}", file=sys.stderr
                )
        return len(evidence)

    def tee(
        self,
        in_fd: int,
        out_fd: int,
        *,
        host: str | None = None,
        rank: int | None = None,
        exit_code: int | None = None,
        exit_signal: int | None = None,
    ) -> int:
        """Copy `in_fd` to `out_fd` byte for byte while the analyzer process scans it (the
        copy never waits for analysis); the status `denpex scan` exits with: 0 no failure,
        1 failure, 2 analysis failed."""
        from denpex.lite.runner import RunResult, tee_stream

        session = self
        name = STREAM_NAMES[1]

        class _Tee:
            """The runner's session protocol for a stream whose end is not a job's exit."""

            def feed(
                self, stream: int, data: bytes, gap: bool, arrival_ns: int | None = None
            ) -> None:
                session.inputs.total_bytes += len(data)
                session.feed(stream, data, gap, arrival_ns)

            def tick(self) -> None:
                pass

            def finish(self, result: RunResult) -> int:
                if session.inputs.total_bytes == 0:
                    session.inputs.empty.append("stdin")
                stats = {"dropped_analysis_bytes": int(result.bytes_dropped)}
                diagnosis = session.conclude(exit_code, exit_signal, stats)
                return 1 if diagnosis.status == "failed" else 0

        def factory(_pid: int | None) -> _Tee:
            session.scanner.stream(name, host=host, rank=rank)
            return _Tee()

        result = tee_stream(in_fd, out_fd, session_factory=factory)
        return result.analysis_status if result.analysis_status in (0, 1) else 2

    # -- the runner's AnalysisSession protocol ---------------------------------------------
    def feed(self, stream: int, data: bytes, gap: bool, arrival_ns: int | None = None) -> None:
        # a live stream: lines without a time of their own get the time they arrived (the
        # relay's stamp when it has one: the analyzer may run behind the job)
        name = STREAM_NAMES.get(stream, f"fd{stream}")
        arrived = time.time_ns() if arrival_ns is None else arrival_ns
        self._scan(name, data, gap=gap, arrival_ns=arrived)

    def tick(self) -> None:
        if self.job is not None:
            self.job.tick()
        if self.sdk is not None:
            for item in self.sdk.poll():
                self.scanner.add_sdk(item)

    def _finish_sdk(self) -> None:
        """The job ended: take what its processes still sent, then close the socket."""
        if self.sdk is None:
            return
        for item in self.sdk.drain():
            self.scanner.add_sdk(item)
        stats = self.sdk.stats
        if stats.garbage_lines or stats.oversized_lines:
            self.notes.append(
                f"{stats.garbage_lines + stats.oversized_lines} unreadable line(s) on the SDK "
                f"socket ({stats.last_error or 'over the size cap'})"
            )
        self.sdk.close()
        self.sdk = None

    def finish(self, result) -> None:
        """Called once after the child ended (`result` is the runner's RunResult)."""
        self.tick()
        self._finish_sdk()
        stats = {
            "dropped_analysis_bytes": int(result.bytes_dropped),
            "relayed_bytes": int(result.bytes_total),
        }
        if getattr(result, "bytes_spilled", 0):  # analysis lagged: it read a backlog on disk
            stats["spilled_analysis_bytes"] = int(result.bytes_spilled)
        self.conclude(result.exit_code, result.exit_signal, stats)

    # -- diagnosis and reports -------------------------------------------------------------
    def conclude(
        self,
        exit_code: int | None,
        exit_signal: int | None,
        extra_stats: dict[str, int] | None = None,
    ) -> Diagnosis:
        for name, tails in self._tails.items():
            self._scan_tails(name, tails.flush())
        self.scanner.close_all()
        self.scanner.apply_stream_defaults()
        evidence = self.scanner.evidence
        explanations = self.catalog.explanations()
        watch_stats: dict[str, int] = {}
        if self.job is not None:
            found, notes, watch_stats = self.job.finish(len(evidence))
            evidence.extend(found)
            self.notes.extend(notes)
        evidence.extend(self._agent_evidence(len(evidence)))
        dropped = sum(self.scanner.sdk_dropped.values())
        if dropped:
            self.notes.append(f"the training SDK dropped {dropped} message(s) (queue full)")
        stats = self.scanner.stats()
        stats.setdefault("dropped_analysis_bytes", 0)
        stats.update(watch_stats)
        stats.update(extra_stats or {})
        every_tail = list(self._tails.values())
        self.notes.extend(self.inputs.notes(every_tail, LINE_CAP))
        stats.update({k: v for k, v in self.inputs.counts(every_tail).items() if v})
        self._prepare_retrieval(evidence)
        self.diagnosis = diagnose(
            DiagnosisInput(
                evidence=evidence,
                exit_code=exit_code,
                exit_signal=exit_signal,
                stats=stats,
                explanations=explanations,
                notes=self.notes,
                coverage_lost=self.scanner.coverage_lost,
            )
        )
        self.write_reports(self.diagnosis)
        return self.diagnosis

    def _agent_evidence(self, numbered_from: int) -> list:
        """What the node agent saw of this job, less the sources this run read itself."""
        if self.agent is None or self.child_pid is None:
            return []
        found = self.agent.evidence(self.agent_since_ns, self.child_pid)
        self.agent.unregister(self.child_pid)
        if self.agent.reason:
            self.notes.append(self.agent.reason)
        watch = self.host_watch
        seen_here = {"kmsg"} if watch is not None and watch.kmsg is not None else set()
        if watch is not None and watch.cgroup is not None:
            seen_here.add("cgroup")
        kept = [e for e in found if e.event.source not in seen_here]
        for offset, item in enumerate(kept, start=1):
            item.event.attrs["agent_evidence_id"] = item.id
            item.id = f"e{numbered_from + offset}"
        if kept:
            self.notes.append(f"{len(kept)} piece(s) of evidence from the node agent")
        return kept

    def _prepare_retrieval(self, evidence: list) -> None:
        """Load the retrieval model in the background, once, where a block is likely to
        follow the diagnosis: a text report of evidence that holds a failure."""
        if self._retrieval_ready is not None or not self.options.text:
            return
        if not any(e.is_failure for e in evidence):
            return
        from denpex.retrieval.lookup import prepare

        self._retrieval_ready = threading.Thread(
            target=prepare, args=(self.catalog,), name="denpex-retrieval", daemon=True
        )
        self._retrieval_ready.start()

    def write_reports(self, diagnosis: Diagnosis) -> None:
        from denpex.lite.report_html import render_html
        from denpex.lite.report_text import render_text

        data = diagnosis.to_dict()
        opts = self.options
        if opts.report_path:
            _write_file(opts.report_path, jsonio.dumps(data, pretty=True) + b"\n")
        if opts.html_path:
            _write_file(opts.html_path, render_html(data, title=opts.title).encode("utf-8"))
        if opts.json_stdout:
            sys.stdout.buffer.write(jsonio.dumps(data, pretty=True) + b"\n")
            sys.stdout.flush()
        if opts.text:
            color = opts.color if opts.color is not None else _stderr_is_color_tty()
            width = _terminal_width()
            sys.stderr.write(render_text(data, color=color, width=width))
            sys.stderr.flush()
        if opts.sinks:
            facts = self.run_facts()
            for sink in opts.sinks:
                sink(data, facts)
        if opts.text:  # after the verdict, which never waits for the model to load
            self.write_retrieval(data)
        if self._retrieval_ready is not None:  # never left loading while the process exits
            self._retrieval_ready.join()

    def run_facts(self) -> dict:
        """started_ns, name, gpus and labels of this run, for its report (those known). A
        scan reads logs from anywhere: this host's driver and kernel are not theirs."""
        watch = self.host_watch
        boards = self.boards.result() if self.boards is not None else None
        if self.boards is not None and self.boards.problem:
            log.info("job report: %s", self.boards.problem)
        return run_facts(
            roots=watch.roots if watch is not None else Roots(),
            env=os.environ,
            host=self.scanner.default_host or socket.gethostname(),
            started_ns=self.agent_since_ns if watch is not None else None,
            processes=self.job.processes if self.job is not None else None,
            argv=self.options.command,
            on_this_host=watch is not None,
            boards=boards,
        )

    def write_retrieval(self, data: dict) -> None:
        """The retrieval block under the verdict when the rag extra is installed; nothing at
        all when it is not."""
        from denpex.lite.report_text import render_block
        from denpex.retrieval.lookup import retrieval_block
        from denpex.retrieval.rewrite import rewritten_lines

        if self._retrieval_ready is not None:
            self._retrieval_ready.join()
        block = retrieval_block(data, self.catalog, incidents=self.options.incidents)
        if block is None:
            return
        color = self.options.color if self.options.color is not None else _stderr_is_color_tty()
        lines = block.lines() + rewritten_lines(data, block)
        sys.stderr.write(render_block(lines, color=color, width=_terminal_width()))
        sys.stderr.flush()


def _write_file(path: str, data: bytes) -> None:
    """Write atomically (temp file + rename) so a reader never sees half a report."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)


def _stderr_is_color_tty() -> bool:
    return (
        sys.stderr.isatty()
        and os.environ.get("NO_COLOR") is None
        and os.environ.get("TERM") != "dumb"
    )


def _terminal_width() -> int:
    try:
        return max(60, min(160, os.get_terminal_size(sys.stderr.fileno()).columns))
    except OSError:
        return 80
