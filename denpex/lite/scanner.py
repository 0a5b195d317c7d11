"""Turns raw output bytes into Evidence: line splitting, ANSI stripping, catalog matching.

Each chunk is split and cleaned (ANSI escapes, quote markers) in one native pass into one
buffer of lines (`denpex._native.linebatch`), which the matcher and every bytes.find read as
a whole; only lines that match, or hold a word a learner looks for, become Python objects
and are parsed for prefixes (rank, host, time), so ordinary output costs two native passes. Each piece of
evidence keeps where it came from (attrs `file`, `line`, and `frame` for a traceback) and,
on a live stream, the time its first byte arrived. A line without a rank of its own never
takes a neighbour's: only the stream's own rank (a file name, `--rank`) or its process (a
pid the wrapper or a launcher summary maps to a rank). Never writes anywhere: pass-through
is the runner's job, reporting the session's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

import denpex._native as native
from denpex._native.linebatch_ref import ANSI
from denpex.catalog import Catalog, Match
from denpex.catalog.schema import Signature
from denpex.core.events import Event, Evidence, severity_rank
from denpex.core.scan_cues import NONFINITE, WORDS
from denpex.core.sdk_wire import STDERR_PREFIX, SdkWireError, decode_message, stderr_payload
from denpex.lite.prefixes import ParsedLine, iso_to_ns, parse_line, year_in
from denpex.lite.processes import JobFacts, LauncherState, innermost_frame, learn
from denpex.series.log_watch import LogSeries

LINE_CAP = 64 * 1024
MAX_EVIDENCE = 20_000
_LOOKBACK_FOR_TIME = 40
# facts a job states about itself, used to attribute evidence to hosts and ranks: NCCL's
# "comm 0x… rank 13 nranks 16 cudaDev 5 nvmlDev 5 busId 3b000" (GPU → rank); launcher
# summaries (pid → rank, rank → host) are read by denpex.lite.processes
_NCCL_COMM = re.compile(
    rb" rank (\d{1,6}) nranks \d{1,6} cudaDev (\d{1,3}) (?:nvmlDev \d{1,3} )?busId ([0-9a-fA-F]{1,12})"
)
# NCCL's own line prefix "node7:4100:4100 [3] NCCL INFO …" names the host that printed it:
# found by its ":pid:tid [dev] " part, which starts with a literal (the engine skips to each
# ':'; a pattern led by the host's character class is tried at every byte, 20× slower), the
# host then read back from there
_NCCL_PID_TID = re.compile(rb":\d{1,10}:\d{1,10} \[\d{1,3}\] ")
_HOST_CHARS = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")
_HOST_MAX = 63
_NCCL_HOST_AT_START = re.compile(rb"([A-Za-z][A-Za-z0-9_.-]{0,62}):\d{1,10}:\d{1,10} \[\d{1,3}\] ")
_SRUN_TASKS = re.compile(
    rb"srun: error: ([A-Za-z0-9][A-Za-z0-9_.-]{0,62}): tasks? ([0-9][0-9,-]{0,200}):"
)
# captures that name the process a line is about ("Killed process 42431", "pid: 42431")
_PID_CAPTURES = ("pid", "pid_table", "pid2", "worker_pid")
_PCI = re.compile(r"^(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.([0-7]))?$")


def pci_bus_id(pci: str) -> int | None:
    """NCCL's integer form of a PCI address: '0000:3b:00' and '0000:3b:00.0' → 0x3b000."""
    found = _PCI.match(pci.strip())
    if not found:
        return None
    domain, bus, device, function = found.groups()
    return int(f"{domain or '0'}{bus}{device}{function or '0'}", 16)


def strip_ansi(line: bytes) -> bytes:
    return ANSI.sub(b"", line) if b"\x1b" in line else line


@dataclass(slots=True)
class StreamState:
    """Per input stream (a file, the child's stdout, stdin): partial line and defaults."""

    name: str
    splitter: Any  # a LineBatcher, native or reference
    host: str | None = None
    rank: int | None = None
    last_ts_ns: int | None = None
    source: str = "log"
    year: int | None = None  # completes glog/syslog times, which carry no year
    nccl_hosts: set[str] = field(default_factory=set)  # hosts named by NCCL's line prefixes
    hosts_seen: dict[str, int] = field(default_factory=dict)
    launcher: LauncherState = field(default_factory=LauncherState)
    newlines: int = 0  # b"\n" seen before the current chunk: line numbers start from it
    partial: bool = False  # a line has begun and not yet ended
    partial_line: int = 1  # the line number of that line
    partial_ns: int | None = None  # when its first byte arrived (live streams)


class ClosedLines:
    """The splitter of a stream that was scanned to its end elsewhere (another process) and
    closed there: what its lines lost to the cap; it holds no partial line."""

    __slots__ = ("discarded_bytes", "truncated_bytes")

    def __init__(self, truncated_bytes: int = 0, discarded_bytes: int = 0) -> None:
        self.truncated_bytes = truncated_bytes
        self.discarded_bytes = discarded_bytes

    def feed(self, data: bytes) -> Any:
        raise ValueError("this stream was closed: nothing more can be fed to it")

    def flush(self) -> list[bytes]:
        return []

    def reset(self) -> None:
        pass


@dataclass(slots=True)
class ScanPart:
    """What a Scanner found in streams it read to their end, handed to another Scanner
    (`Scanner.part` → `Scanner.absorb`): `denpex scan` reads each file in its own process."""

    evidence: list[Evidence]
    streams: list[StreamState]
    seq: int
    bytes: int
    lines: int
    matches: int
    evidence_dropped: int
    facts: JobFacts
    rank_of_gpu: dict[tuple[str | None, int], int]
    rank_of_device: dict[tuple[str | None, int], int]
    sdk_messages: int
    sdk_bad_lines: int
    sdk_dropped: dict[tuple[str | None, int | None], int]
    coverage_lost: list[dict[str, Any]]


class Scanner:
    """Accumulates evidence from any number of byte streams against one catalog."""

    def __init__(self, catalog: Catalog, *, default_host: str | None = None) -> None:
        self.catalog = catalog
        self.default_host = default_host
        self.evidence: list[Evidence] = []
        self.streams: dict[str, StreamState] = {}
        self.bytes = 0
        self.lines = 0
        self.matches = 0
        self.evidence_dropped = 0
        self.rank_of_gpu: dict[tuple[str | None, int], int] = {}  # (host, bus id) → rank
        self.rank_of_device: dict[tuple[str | None, int], int] = {}  # (host, cudaDev) → rank
        self.facts = JobFacts()  # pid → rank, rank → host, world size
        self.host_of_rank = self.facts.host_of_rank
        self._seq = 0
        self.sdk_messages = 0  # SDK Evidence/Events taken in (socket or `denpex-sdk:` lines)
        self.sdk_bad_lines = 0  # `denpex-sdk:` lines that could not be decoded
        self.sdk_dropped: dict[tuple[str | None, int | None], int] = {}  # per (host, pid)
        # SDK checks that stopped running (Event kind "state", body "sdk_coverage_lost"):
        # the diagnosis says so and never reads as a plain OK
        self.coverage_lost: list[dict[str, Any]] = []
        self._sdk_ids: set[str] = set()
        self.series = LogSeries()  # the numbers the job prints (loss, scale, step time)
        self._splitter_cls = native.load("linebatch").LineBatcher

    # -- input ---------------------------------------------------------------------------
    def stream(
        self, name: str, *, host: str | None = None, rank: int | None = None, source: str = "log"
    ) -> StreamState:
        state = self.streams.get(name)
        if state is None:
            state = StreamState(name, self._splitter_cls(LINE_CAP), host, rank, source=source)
            self.streams[name] = state
        return state

    def note_process(
        self,
        pid: int,
        *,
        rank: int | None = None,
        local_rank: int | None = None,
        host: str | None = None,
    ) -> None:
        """Record what is known of one of the job's processes (the wrapper reads it from
        `/proc/PID/environ`): evidence about that pid and without a rank takes this one."""
        self.facts.processes.note(pid, rank=rank, local_rank=local_rank, host=host)

    def feed(
        self, name: str, data: bytes, *, gap: bool = False, arrival_ns: int | None = None
    ) -> None:
        """Scan a chunk of stream `name`; `gap` means bytes were lost just before it;
        `arrival_ns` (live streams) times the lines that carry no time of their own: each
        line gets the arrival of the chunk its first byte came in."""
        state = self.stream(name)
        if gap:
            state.splitter.reset()
            state.partial = False
        self.bytes += len(data)
        continued = state.partial
        lines = state.splitter.feed(data)
        self._scan(state, lines, arrival_ns, data=data, continued=continued)
        _advance(state, data, lines.newlines, arrival_ns)

    def close(self, name: str, arrival_ns: int | None = None) -> None:
        state = self.streams.get(name)
        if state is not None:
            lines = state.splitter.flush()
            self._scan(state, lines, arrival_ns, continued=bool(lines))
            state.partial = False

    def close_all(self) -> None:
        for name in list(self.streams):
            self.close(name)
        ends = {name: state.last_ts_ns for name, state in self.streams.items()}
        for item in self.series.finish(ends):
            self._add_detected(item)

    def add_parsed(self, state: StreamState, parsed: ParsedLine) -> None:
        """Scan one already-parsed line (kernel-log records arrive this way)."""
        raw = parsed.body
        self.lines += 1
        self._seq += 1
        for match in self.catalog.match_lines([raw]):
            self._add_evidence(state, parsed, match.signature, raw, self._seq)

    @property
    def truncated_bytes(self) -> int:
        return sum(s.splitter.truncated_bytes for s in self.streams.values())

    # -- matching ------------------------------------------------------------------------
    def _scan(
        self,
        state: StreamState,
        lines: Any,
        arrival_ns: int | None = None,
        *,
        data: bytes = b"",
        continued: bool = False,
    ) -> None:
        """Match one batch of complete lines (a linebatch Batch: cleaned, joined). `data` is
        the chunk they came from; `continued`: the first line began in an earlier chunk."""
        if not len(lines):
            return
        first_seq = self._seq + 1
        self._seq += len(lines)
        self.lines += len(lines)
        parsed_cache: dict[int, ParsedLine] = {}
        if state.year is None:
            state.year = year_in(lines.head(2000))

        def parsed_at(index: int) -> ParsedLine:
            if index not in parsed_cache:
                parsed_cache[index] = parse_line(lines[index], state.year)
            return parsed_cache[index]

        joined = lines.joined
        # the signatures, the words whose lines the learners read (and that say whether a
        # batch holds SDK lines) and the sampler's non-finite values: one pass (scan_cues)
        matches, cues = self.catalog.scan_joined(joined)
        words: dict[bytes, list[int]] = {word: [] for word in WORDS}
        nonfinite: list[int] = []
        for line_index, cue in cues:
            if cue == NONFINITE:
                nonfinite.append(line_index)
            else:
                words[WORDS[cue]].append(line_index)
        self._learn_attribution(state, lines, joined, parsed_at, first_seq, words)
        batch = lines  # its line numbers stay right when SDK lines are blanked below
        if words[STDERR_PREFIX]:
            lines = self._take_sdk_lines(state, lines, parsed_at, first_seq)
        series = self.series.observe(
            joined, lines, parsed_at, first_seq, arrival_ns, state.name, nonfinite
        )
        if isinstance(lines, list):  # SDK lines were blanked: matched again without them
            matches = self.catalog.match_joined(b"\n".join(lines))
        # one line is one piece of evidence per category, however many variants match it:
        # the most severe variant (the first of equals, the catalog lists specific ones first)
        best: dict[tuple[int, str], Match] = {}
        for match in matches:
            key = (match.line_index, match.signature.category)
            kept = best.get(key)
            if kept is None or severity_rank(match.signature.severity) > severity_rank(
                kept.signature.severity
            ):
                best[key] = match
        for index, found in series:  # a line a signature matched keeps that evidence alone
            if (index, found.category) not in best:
                self._add_detected(found)
        matched = sorted(best.values(), key=lambda m: m.line_index)
        for match in matched:
            parsed = parsed_at(match.line_index)
            if data or (continued and match.line_index == 0):
                parsed.attrs["file"] = state.name
                parsed.attrs["line"] = _line_number(state, batch, match.line_index, continued)
            # a live line is timed by its first byte: a line that began in an earlier chunk
            # arrived then, not when its end (or the process's exit) flushed it
            if "frame" not in parsed.attrs:  # a line matched for two categories: looked up once
                frame = innermost_frame(
                    state.launcher, lines, match.line_index, parsed_at, parsed.host, parsed.rank
                )
                if frame is not None:
                    parsed.attrs["frame"] = frame
            arrived = state.partial_ns if continued and match.line_index == 0 else arrival_ns
            if parsed.ts_ns is None and arrived is not None:
                parsed.ts_ns = arrived
                parsed.attrs["ts_arrival"] = True
            elif parsed.ts_ns is None:
                parsed.ts_ns = self._time_before(state, parsed_at, match.line_index)
                if parsed.ts_ns is not None:
                    parsed.attrs["ts_inherited"] = True
            self._add_evidence(
                state, parsed, match.signature, parsed.body, first_seq + match.line_index
            )
        # remember the latest time of this stream for lines that carry none
        for index in range(len(lines) - 1, max(-1, len(lines) - 4), -1):
            ts = parsed_at(index).ts_ns
            if ts is not None:
                state.last_ts_ns = ts
                break

    def _learn_attribution(
        self,
        state: StreamState,
        lines: Any,
        joined: bytes,
        parsed_at,
        first_seq: int,
        found: dict[bytes, list[int]],
    ) -> None:
        """Learns who is who from the lines (`joined`: them joined by b"\\n"; `found`: the
        lines holding each of scan_cues.WORDS)."""
        learn(self.facts, state.launcher, lines, joined, parsed_at, first_seq, found)
        if len(state.nccl_hosts) < 2 and b" NCCL " in joined:
            _nccl_hosts(joined, state.nccl_hosts, 2)
        if found[b"busId"]:
            for index in found[b"busId"]:
                line = lines[index]
                comm = _NCCL_COMM.search(line)
                if comm:
                    host, rank = _host_of(line, parsed_at, index), int(comm.group(1))
                    self.rank_of_gpu[(host, int(comm.group(3), 16))] = rank
                    self.rank_of_device[(host, int(comm.group(2)))] = rank
        if found[b"srun: error: "]:
            for stated in _SRUN_TASKS.finditer(joined):
                for rank in _rank_list(stated.group(2).decode()):
                    self.host_of_rank.setdefault(rank, stated.group(1).decode())

    # -- SDK messages (`denpex-sdk: {json}` lines and the wrapper's socket) -----------------
    def _take_sdk_lines(
        self, state: StreamState, lines: Any, parsed_at, first_seq: int
    ) -> list[bytes]:
        """SDK lines become their Evidence directly; they are blanked so that no signature
        matches the JSON a second time (blank, not removed: line indexes stay aligned)."""
        kept = list(lines)
        for index, line in enumerate(lines):
            payload = stderr_payload(line) if STDERR_PREFIX in line else None
            if payload is None:
                continue
            kept[index] = b""
            try:
                item = decode_message(payload)
            except SdkWireError:
                self.sdk_bad_lines += 1
                continue
            parsed = parsed_at(index)  # a `[rank3]:` or host prefix fills what the SDK left out
            self.add_sdk(
                item, state.name, host=parsed.host, rank=parsed.rank, seq=first_seq + index
            )
        return kept

    def add_sdk(
        self,
        item: Evidence | Event,
        stream: str = "sdk",
        *,
        host: str | None = None,
        rank: int | None = None,
        seq: int | None = None,
    ) -> None:
        """Take one SDK message: Evidence joins the run's evidence as it is (renumbered, the
        SDK's own id kept in attrs.sdk_id, repeats ignored); Events are counted."""
        self.sdk_messages += 1
        event = item.event if isinstance(item, Evidence) else item
        event.host = event.host or host or self.default_host
        event.rank = event.rank if event.rank is not None else rank
        if not isinstance(item, Evidence):
            if event.kind == "metric" and event.body == "sdk_dropped_messages":
                value = event.attrs.get("value")
                if isinstance(value, int | float):
                    self.sdk_dropped[(event.host, event.pid)] = int(value)
            elif event.kind == "state" and event.body == "sdk_coverage_lost":
                self._coverage_lost(event)
            return
        if item.id in self._sdk_ids:
            return
        self._sdk_ids.add(item.id)
        self.matches += 1
        if len(self.evidence) >= MAX_EVIDENCE:
            self.evidence_dropped += 1
            return
        if seq is None:
            self._seq += 1
            seq = self._seq
        event.seq = seq
        event.attrs = {**event.attrs, "sdk_id": item.id, "stream": stream}
        item.id = f"e{len(self.evidence) + 1}"
        self.evidence.append(item)

    def _add_detected(self, item: Evidence) -> None:
        """Evidence of a detector over the log's numbers (denpex.series), numbered here."""
        self.matches += 1
        if len(self.evidence) >= MAX_EVIDENCE:
            self.evidence_dropped += 1
            return
        item.id = f"e{len(self.evidence) + 1}"
        self.evidence.append(item)

    def _coverage_lost(self, event: Event) -> None:
        attrs = event.attrs
        lost = {
            "check": str(attrs.get("check") or "an SDK check"),
            "since_step": attrs.get("since_step")
            if isinstance(attrs.get("since_step"), int)
            else None,
            "reason": str(attrs.get("reason") or ""),
            "host": event.host,
            "rank": event.rank,
        }
        key = (lost["check"], lost["host"], lost["rank"])
        if all((c["check"], c["host"], c["rank"]) != key for c in self.coverage_lost):
            self.coverage_lost.append(lost)

    def _time_before(self, state: StreamState, parsed_at, index: int) -> int | None:
        for back in range(index - 1, max(-1, index - _LOOKBACK_FOR_TIME), -1):
            ts = parsed_at(back).ts_ns
            if ts is not None:
                return ts
        return state.last_ts_ns

    def _add_evidence(
        self, state: StreamState, parsed: ParsedLine, signature: Signature, body: bytes, seq: int
    ) -> None:
        source = parsed.source if parsed.source != "log" else state.source
        if not signature.accepts_source(source):
            return
        self.matches += 1
        if len(self.evidence) >= MAX_EVIDENCE:
            self.evidence_dropped += 1
            return
        captures = signature.captures(body)
        if parsed.ts_ns is None or parsed.attrs.get("ts_inherited"):
            stated = iso_to_ns(captures.get("time", ""))
            if stated is not None:  # "CANCELLED AT 2026-11-30T04:56:09": the message's own time
                parsed.ts_ns = stated
                parsed.attrs.pop("ts_inherited", None)
        # a message about another host or rank ("srun: error: node3: task 3: Killed") names
        # its subject in the captures, which outrank the prefix of the line that carried it
        host = captures.get("host") or parsed.host or state.host or self.default_host
        own_rank = parsed.rank if parsed.rank is not None else state.rank
        rank = _int(captures.get("rank"))
        if rank is None:
            rank = own_rank
        if host:
            state.hosts_seen[host] = state.hosts_seen.get(host, 0) + 1
        event = Event(
            body=body.decode("utf-8", "replace"),
            ts_ns=parsed.ts_ns,
            host=host,
            source=source,
            rank=rank,
            pid=parsed.pid,
            attrs={**parsed.attrs, "stream": state.name},
            seq=seq,
        )
        self.evidence.append(signature.evidence(event, captures, f"e{len(self.evidence) + 1}"))

    def apply_stream_defaults(self) -> None:
        """Attribute evidence that lacks a host or rank: the process it is about → its rank
        (note_process, launcher summaries), a GPU's PCI address → the rank NCCL put on it, a
        rank → the host torchrun's summary names, else the stream's own host and rank."""
        self._ranks_from_processes()
        gpus_by_bus: dict[int, set[tuple[str | None, int]]] = {}
        for (gpu_host, bus), gpu_rank in self.rank_of_gpu.items():
            gpus_by_bus.setdefault(bus, set()).add((gpu_host, gpu_rank))
        for evidence in self.evidence:
            event = evidence.event
            gpu_bus = pci_bus_id(evidence.captures.get("pci", ""))
            if event.rank is None and gpu_bus is not None:
                event.rank = self.rank_of_gpu.get((event.host, gpu_bus))
                if event.rank is None and len(gpus_by_bus.get(gpu_bus, ())) == 1:
                    gpu_host, event.rank = next(iter(gpus_by_bus[gpu_bus]))
                    event.host = event.host or gpu_host
            device = event.attrs.get("cuda_device")  # NCCL's "host:pid:tid [dev]" prefix
            if event.rank is None and device is not None:
                event.rank = self.rank_of_device.get((event.host, device))
            if event.host is None and event.rank is not None:
                event.host = self.host_of_rank.get(event.rank)
        named_hosts = {*self.host_of_rank.values(), *(h for h, _ in self.rank_of_gpu if h)}
        by_stream: dict[str | None, list[Evidence]] = {}
        for evidence in self.evidence:
            by_stream.setdefault(evidence.event.attrs.get("stream"), []).append(evidence)
        for state in self.streams.values():
            # a default host only for a stream that names one host and one only: blaming the
            # wrong node (and draining it) is worse than naming none
            named = {*state.hosts_seen, *state.nccl_hosts, *named_hosts}
            host = state.host or _single(dict.fromkeys(named))
            rank = state.rank
            if host is None and rank is None:
                continue
            for evidence in by_stream.get(state.name, ()):
                event = evidence.event
                if event.host is None and host is not None:
                    event.host = host
                if event.rank is None and rank is not None:
                    event.rank = rank

        if self.facts.world_size:
            for evidence in self.evidence:
                evidence.event.attrs.setdefault("world_size", self.facts.world_size)

    def _ranks_from_processes(self) -> None:
        """Evidence about a process (its pid captured, or the pid that printed it) takes that
        process's rank; a local rank counts as the rank only on a job of one host."""
        if not len(self.facts.processes):
            return
        hosts = {e.event.host for e in self.evidence if e.event.host}
        hosts.update(self.host_of_rank.values())
        single_host = len(hosts) <= 1
        for evidence in self.evidence:
            event = evidence.event
            if event.rank is not None:
                continue
            pid = next(
                (_int(evidence.captures.get(k)) for k in _PID_CAPTURES if evidence.captures.get(k)),
                None,
            )
            info = self.facts.processes.lookup(
                pid if pid is not None else event.pid or -1, event.host
            )
            if info is None:
                continue
            if info.local_rank is not None:
                event.attrs["local_rank"] = info.local_rank
            rank = (
                info.rank if info.rank is not None else (info.local_rank if single_host else None)
            )
            if rank is not None:
                event.rank = rank
                event.attrs["rank_from_pid"] = info.pid
            event.host = event.host or info.host

    # -- scanning apart, then together --------------------------------------------------
    def part(self) -> ScanPart:
        """Close every stream (their series judged too) and hand over all that was found."""
        self.close_all()
        streams = [
            replace(
                state,
                splitter=ClosedLines(
                    state.splitter.truncated_bytes, state.splitter.discarded_bytes
                ),
            )
            for state in self.streams.values()
        ]
        return ScanPart(
            self.evidence,
            streams,
            self._seq,
            self.bytes,
            self.lines,
            self.matches,
            self.evidence_dropped,
            self.facts,
            self.rank_of_gpu,
            self.rank_of_device,
            self.sdk_messages,
            self.sdk_bad_lines,
            self.sdk_dropped,
            self.coverage_lost,
        )

    def absorb(self, part: ScanPart) -> None:
        """Take what another scanner found as if its streams had been fed here after this
        one's: its lines numbered on from this scanner's, its evidence renumbered, an SDK
        message already taken ignored, the evidence cap shared, its facts added to these
        (a rank's host: the first stated; a process: noted again)."""
        offset = self._seq
        self._seq += part.seq
        self.bytes += part.bytes
        self.lines += part.lines
        self.matches += part.matches
        self.evidence_dropped += part.evidence_dropped
        for state in part.streams:
            known = self.streams.get(state.name)
            if known is not None and isinstance(known.splitter, ClosedLines):
                known.splitter.truncated_bytes += state.splitter.truncated_bytes
                known.nccl_hosts.update(state.nccl_hosts)
                for host, count in state.hosts_seen.items():
                    known.hosts_seen[host] = known.hosts_seen.get(host, 0) + count
            else:
                self.streams[state.name] = state
        for item in part.evidence:
            sdk_id = item.event.attrs.get("sdk_id")
            if sdk_id is not None:
                if sdk_id in self._sdk_ids:
                    self.matches -= 1
                    continue
                self._sdk_ids.add(sdk_id)
            if item.event.seq is not None:
                item.event.seq += offset
            if len(self.evidence) >= MAX_EVIDENCE:
                self.evidence_dropped += 1
                continue
            item.id = f"e{len(self.evidence) + 1}"
            self.evidence.append(item)
        self.rank_of_gpu.update(part.rank_of_gpu)
        self.rank_of_device.update(part.rank_of_device)
        facts = part.facts
        for info in facts.processes.infos():
            self.facts.processes.note(
                info.pid, rank=info.rank, local_rank=info.local_rank, host=info.host
            )
        if facts.world_size is not None:
            self.facts.world_size = max(facts.world_size, self.facts.world_size or 0)
        for rank, host in facts.host_of_rank.items():
            self.host_of_rank.setdefault(rank, host)
        self.sdk_messages += part.sdk_messages
        self.sdk_bad_lines += part.sdk_bad_lines
        self.sdk_dropped.update(part.sdk_dropped)
        for lost in part.coverage_lost:
            key = (lost["check"], lost["host"], lost["rank"])
            if all((c["check"], c["host"], c["rank"]) != key for c in self.coverage_lost):
                self.coverage_lost.append(lost)

    def stats(self) -> dict[str, int]:
        stats = {
            "bytes": self.bytes,
            "lines": self.lines,
            "matches": self.matches,
            "truncated_line_bytes": self.truncated_bytes,
            "evidence_dropped": self.evidence_dropped,
        }
        if self.sdk_messages or self.sdk_bad_lines:  # only runs that used the SDK show these
            stats["sdk_messages"] = self.sdk_messages
            stats["sdk_bad_lines"] = self.sdk_bad_lines
            stats["sdk_dropped_messages"] = sum(self.sdk_dropped.values())
        return stats


def _advance(state: StreamState, data: bytes, newlines: int, arrival_ns: int | None) -> None:
    """After a chunk holding `newlines` b"\\n" (its batch counted them): where the next line
    starts (its number, when its first byte came)."""
    if not data:
        return
    if data[-1:] in (b"\n", b"\r"):
        state.partial = False
    elif newlines or b"\r" in data or not state.partial:
        # a new line began after the chunk's last line end (else the open one goes on)
        state.partial, state.partial_line = True, state.newlines + newlines + 1
        state.partial_ns = arrival_ns
    state.newlines += newlines


def _line_number(state: StreamState, lines: Any, index: int, continued: bool) -> int:
    """The line number (from 1, counting b"\\n") of line `index` of a batch of `state`'s
    stream, fed after state.newlines newlines; a line begun in an earlier chunk has the
    number it got when it began."""
    if index == 0 and continued:
        return state.partial_line
    return state.newlines + lines.newlines_before(index) + 1


def _host_of(line: bytes, parsed_at, index: int) -> str | None:
    """The host whose NCCL printed `line`: a line that starts with NCCL's own prefix
    ("node7:4100:4100 [3] ", the host starting with a letter: no time) has no other prefix
    (none of parse_line's patterns matches there), so its host is read off that prefix
    without parsing the whole line."""
    found = _NCCL_HOST_AT_START.match(line)
    return found.group(1).decode() if found else parsed_at(index).host


def _nccl_hosts(joined: bytes, hosts: set[str], limit: int) -> None:
    """Add the hosts NCCL's line prefixes name in `joined` to `hosts` until it holds `limit`
    (one host or several is all the scanner asks): a host starts with a letter, holds at
    most 63 of [A-Za-z0-9_.-] and follows a line start, ' ', ':' or ']'."""
    for found in _NCCL_PID_TID.finditer(joined):
        end = begin = found.start()
        while begin > 0 and joined[begin - 1] in _HOST_CHARS and end - begin <= _HOST_MAX:
            begin -= 1
        if begin == end or end - begin > _HOST_MAX or not chr(joined[begin]).isalpha():
            continue
        if begin > 0 and joined[begin - 1] not in b" :]\n":
            continue
        hosts.add(joined[begin:end].decode())
        if len(hosts) >= limit:
            return


def _rank_list(text: str) -> list[int]:
    """'0,2-3' → [0, 2, 3] (Slurm's task lists), at most 4096 ranks."""
    ranks: list[int] = []
    for part in text.strip(",").split(","):
        low, _, high = part.partition("-")
        if low.isdigit() and (not high or high.isdigit()):
            ranks.extend(range(int(low), min(int(high or low), int(low) + 4096) + 1))
    return ranks[:4096]


def _int(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


def _single(counts: dict) -> Any:
    return next(iter(counts)) if len(counts) == 1 else None
