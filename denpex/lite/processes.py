"""What a job's output says about its processes: pid → rank from launcher summaries, the
world size, and the innermost frame of each traceback.

Facts only, learned line by line (a summary may be split across chunks): torchrun's failure
table (`rank : 3 (local_rank: 3)` / `exitcode : -9 (pid: N)`), torch.distributed.elastic's
`failed (exitcode: -11) local_rank: 0 (pid: N)`, DeepSpeed's launcher (`process N spawned
with command: [... '--local_rank=0' ...]`, and its `Killing subprocess N` lines, printed in
local-rank order), `global_world_sizes=[8, ...]`, `WORLD_SIZE=8`, NCCL's `nranks 8`. Never
guesses a rank from a neighbouring line.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from denpex.core.scan_cues import LAUNCHER_WORDS, NRANKS, TABLE_EXIT
from denpex.lite.prefixes import parse_line

_TABLE_HOST = re.compile(rb"^[ \t]{0,8}host[ \t]{0,16}: ([A-Za-z0-9][A-Za-z0-9_.-]{0,62})[ \t]*$")
_TABLE_RANK = re.compile(rb"^[ \t]{0,8}rank[ \t]{0,16}: (\d{1,7}) \(local_rank: (\d{1,7})\)")
_TABLE_EXIT = re.compile(rb"^[ \t]{0,8}exitcode[ \t]{0,16}: (-?\d{1,4}) \(pid: (\d{1,10})\)")
_ELASTIC_FAILED = re.compile(
    rb"failed \(exitcode: -?\d{1,4}\) local_rank: (\d{1,7}) \(pid: (\d{1,10})\)"
)
_DS_SPAWNED = re.compile(
    rb"process (\d{1,10}) spawned with command: \[[^\n]{0,4000}?--local_rank=(\d{1,7})"
)
_DS_KILLING = re.compile(rb"Killing subprocess (\d{1,10})")
_WORLD_SIZE = re.compile(
    rb"global_world_sizes=\[(\d{1,7})|\bWORLD_SIZE[=:] ?(\d{1,7})\b"
    rb"|\bworld[_ ]size['\"]?(?:=|: ?| is )(\d{1,7})\b"
    rb"| nranks (\d{1,7}) cudaDev ",
    re.IGNORECASE,
)
# _WORLD_SIZE where no `world` is in the line (any case): only its NCCL alternative can match
_NRANKS_ALONE = re.compile(rb" nranks (\d{1,7}) cudaDev ", re.IGNORECASE)
_FRAME = re.compile(rb'^[ \t]{1,16}File "([^"\n]{1,1024})", line (\d{1,9}), in ([^ \t\n]{1,200})')
_NCCL_NRANKS = re.compile(rb" rank \d{1,6} nranks (\d{1,7}) cudaDev ")
_TABLE_REACH = 4  # lines between a table's `rank` line and its `exitcode` line
_KILLING_REACH = 20  # lines between two `Killing subprocess` lines of one burst
_FRAME_REACH = 4  # lines between a traceback's innermost frame and its exception line
_TAIL = 4  # lines of the previous chunk kept for looking back across a chunk boundary


@dataclass(slots=True)
class ProcessInfo:
    """What is known of one process of the job."""

    pid: int
    rank: int | None = None
    local_rank: int | None = None
    host: str | None = None


class ProcessTable:
    """pid → rank, local rank and host, from the wrapper (`/proc/PID/environ`) and from
    launcher summaries. A pid seen on several hosts is looked up with its host."""

    def __init__(self) -> None:
        self._by_pid: dict[int, list[ProcessInfo]] = {}

    def note(
        self,
        pid: int,
        *,
        rank: int | None = None,
        local_rank: int | None = None,
        host: str | None = None,
    ) -> None:
        infos = self._by_pid.setdefault(pid, [])
        for info in infos:
            if info.host is None or host is None or info.host == host:
                info.rank = rank if rank is not None else info.rank
                info.local_rank = local_rank if local_rank is not None else info.local_rank
                info.host = info.host or host
                return
        infos.append(ProcessInfo(pid, rank, local_rank, host))

    def lookup(self, pid: int, host: str | None) -> ProcessInfo | None:
        infos = self._by_pid.get(pid, [])
        if host is not None:
            infos = [i for i in infos if i.host in (host, None)]
        return infos[0] if len(infos) == 1 else None

    def infos(self) -> list[ProcessInfo]:
        """Every process noted, in the order first noted."""
        return [info for infos in self._by_pid.values() for info in infos]

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_pid.values())


@dataclass(slots=True)
class LauncherState:
    """Per stream: the parts of a launcher summary seen so far."""

    table_rank: tuple[int, int, int, str | None] | None = None  # seq, rank, local, host
    killing: dict[str | None, tuple[int, int]] = field(default_factory=dict)  # host → seq, n
    tail: list[bytes] = field(default_factory=list)  # the previous chunk's last lines


@dataclass(slots=True)
class JobFacts:
    processes: ProcessTable = field(default_factory=ProcessTable)
    world_size: int | None = None
    host_of_rank: dict[int, str] = field(default_factory=dict)


def learn(
    facts: JobFacts,
    state: LauncherState,
    lines: Sequence[bytes],
    joined: bytes,
    parsed_at: Callable,
    first_seq: int,
    found: Mapping[bytes, list[int]] | None = None,
) -> None:
    """Takes every process fact the chunk `lines` states (`joined` is `lines` joined by
    b"\\n"; a native batch's `line_at` finds their lines); only lines holding a trigger word
    are parsed. `found`: the lines holding each of LAUNCHER_WORDS and TABLE_EXIT
    (denpex.core.scan_cues), when the caller has looked already (the scanner, in the
    catalog's pass). A table's `exitcode : … (pid: N)` line is looked for only after its
    `rank : … (local_rank: …)` line; its `host :` line and a traceback's frames are looked up
    from the line that needs them."""
    needles: tuple[bytes, ...] = LAUNCHER_WORDS
    has_local_rank = bool(found[b"local_rank"]) if found is not None else b"local_rank" in joined
    if state.table_rank is not None or has_local_rank:
        needles = (*needles, TABLE_EXIT)
    others = tuple(n for n in needles if n != NRANKS)
    if found is None:
        indexes = lines_with(joined, needles, getattr(lines, "line_at", None))
        holding_others: set[int] | None = None
    else:
        indexes = sorted({index for needle in needles for index in found[needle]})
        holding_others = {index for needle in others for index in found[needle]}
    for index in indexes:
        if holding_others is None:
            size = _nccl_world_size(lines[index], others)
        else:  # which lines hold the other words is known: no search of each line for them
            size = None if index in holding_others else _nccl_world_size(lines[index], ())
        if size is not None:
            facts.world_size = max(size, facts.world_size or 0)
            continue
        before = _Before(state, lines, index, parsed_at)
        _process_line(facts, state, parsed_at(index), first_seq + index, before)
    state.tail = list(lines[-_TAIL:])


def _nccl_world_size(line: bytes, others: tuple[bytes, ...]) -> int | None:
    """The world size of a line whose one fact is NCCL's `rank R nranks N cudaDev` (every
    NCCL communicator prints one: thousands in a long log), read without parsing its
    prefixes, or None when the line may hold another fact (it holds one of the `others`
    trigger words, or another world size). Exact: no prefix parse_line strips ends in
    `rank R `, so the words are in the body; a journal record is parsed."""
    if line[:1] == b"{" or any(n in line for n in others):
        return None
    if b"world" in line.lower():
        stated = [(m.group(4), m.end(4)) for m in _WORLD_SIZE.finditer(line)]
    else:  # the usual NCCL line: the one alternative that can match, found from its literal
        stated = [(m.group(1), m.end(1)) for m in _NRANKS_ALONE.finditer(line)]
    if len(stated) != 1 or stated[0][0] is None:
        return None
    comm = _NCCL_NRANKS.search(line)
    if comm is None or comm.end(1) != stated[0][1]:
        return None
    return int(comm.group(1))


def lines_with(
    joined: bytes, needles: tuple[bytes, ...], line_at: Callable[[int], int] | None = None
) -> list[int]:
    """Indexes of the lines of `joined` that hold any of `needles`, in order; found with
    bytes.find, and turned into line indexes by `line_at` (a native batch's, from the
    offset of a byte) or else counted with bytes.count: a chunk without them costs a few
    scans."""
    hits = []
    for needle in needles:
        at = joined.find(needle)
        while at >= 0:
            hits.append(at)
            at = joined.find(needle, at + len(needle))
    indexes: list[int] = []
    line = last = 0
    for at in sorted(hits):
        if line_at is not None:
            line = line_at(at)
        else:
            line += joined.count(b"\n", last, at)
            last = at
        if not indexes or indexes[-1] != line:
            indexes.append(line)
    return indexes


class _Before:
    """The lines just above one line: earlier in its chunk, then the previous chunk's tail."""

    def __init__(self, state: LauncherState, lines: Sequence[bytes], index: int, parsed_at) -> None:
        self.state, self.lines, self.index, self.parsed_at = state, lines, index, parsed_at

    def parsed(self, back: int):
        at = self.index - back
        if at >= 0:
            return self.parsed_at(at)
        tail = self.state.tail
        return parse_line(tail[at]) if -at <= len(tail) else None


def innermost_frame(
    state: LauncherState, lines: list[bytes], index: int, parsed_at, host, rank
) -> str | None:
    """`data.py:17 in collate`: the traceback frame printed by the same host and rank at most a
    few lines above line `index` (the source line and caret lines sit between)."""
    before = _Before(state, lines, index, parsed_at)
    for back in range(1, _FRAME_REACH + 1):
        parsed = before.parsed(back)
        if parsed is None:
            return None
        if b'File "' not in parsed.body or (parsed.host, parsed.rank) != (host, rank):
            continue
        found = _FRAME.match(parsed.body)
        if found:
            path, line, func = (g.decode("utf-8", "replace") for g in found.groups())
            return f"{os.path.basename(path)}:{line} in {func}"
    return None


def _process_line(facts: JobFacts, state: LauncherState, parsed, seq: int, before: _Before) -> None:
    body, host = parsed.body, parsed.host
    processes = facts.processes
    for stated in _WORLD_SIZE.finditer(body):
        size = int(next(g for g in stated.groups() if g))
        facts.world_size = max(size, facts.world_size or 0)
    if found := _TABLE_RANK.match(body):
        rank, local_rank = int(found.group(1)), int(found.group(2))
        table_host = None
        for back in (1, 2):  # `host : node7` sits just above (`time :` above that)
            above = before.parsed(back)
            named = _TABLE_HOST.match(above.body) if above is not None else None
            if named:
                table_host = named.group(1).decode()
                facts.host_of_rank[rank] = table_host
                break
        state.table_rank = (seq, rank, local_rank, table_host)
        return
    if found := _TABLE_EXIT.match(body):
        if state.table_rank and seq - state.table_rank[0] <= _TABLE_REACH:
            _, rank, local_rank, table_host = state.table_rank
            processes.note(
                int(found.group(2)), rank=rank, local_rank=local_rank, host=table_host or host
            )
        state.table_rank = None
        return
    if found := _ELASTIC_FAILED.search(body):
        processes.note(int(found.group(2)), local_rank=int(found.group(1)), host=host)
        return
    if found := _DS_SPAWNED.search(body):
        processes.note(int(found.group(1)), local_rank=int(found.group(2)), host=host)
        return
    if found := _DS_KILLING.search(body):
        last = state.killing.get(host)
        order = last[1] + 1 if last and seq - last[0] <= _KILLING_REACH else 0
        state.killing[host] = (seq, order)
        pid = int(found.group(1))
        if processes.lookup(pid, host) is None:  # `spawned with command` is the better source
            processes.note(pid, local_rank=order, host=host)
