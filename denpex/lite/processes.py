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
from collections.abc import Callable
from dataclasses import dataclass, field

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
_FRAME = re.compile(rb'^[ \t]{1,16}File "([^"\n]{1,1024})", line (\d{1,9}), in ([^ \t\n]{1,200})')
_TRIGGERS = (
    b"host ",  # torchrun's table: `  host      : node7`
    b"local_rank",
    b"(pid: ",
    b"spawned with command",
    b"Killing subprocess",
    b"world_size",
    b"WORLD_SIZE",
    b"world size",
    b"nranks",
)
_TABLE_REACH = 4  # lines between a table's `host`/`rank` line and its `exitcode` line
_KILLING_REACH = 20  # lines between two `Killing subprocess` lines of one burst
_FRAME_REACH = 4  # lines between a traceback's innermost frame and its exception line
_FRAMES_KEPT = 8


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

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_pid.values())


@dataclass(slots=True)
class LauncherState:
    """Per stream: the parts of a launcher summary seen so far."""

    table_host: tuple[int, str] | None = None  # (seq, host) of the last `host :` line
    table_rank: tuple[int, int, int] | None = None  # (seq, rank, local_rank)
    killing: dict[str | None, tuple[int, int]] = field(default_factory=dict)  # host → seq, n
    frames: dict[tuple[str | None, int | None], list[tuple[int, str]]] = field(default_factory=dict)


@dataclass(slots=True)
class JobFacts:
    processes: ProcessTable = field(default_factory=ProcessTable)
    world_size: int | None = None
    host_of_rank: dict[int, str] = field(default_factory=dict)


def learn(
    facts: JobFacts,
    state: LauncherState,
    lines: list[bytes],
    joined: bytes,
    parsed_at: Callable,
    first_seq: int,
) -> None:
    """Takes every process fact and traceback frame the chunk `lines` states."""
    if b'File "' in joined:
        for index, line in enumerate(lines):
            if b'File "' in line:
                _frame_line(state, parsed_at(index), first_seq + index)
    if not any(t in joined for t in _TRIGGERS):
        return
    for index, line in enumerate(lines):
        if any(t in line for t in _TRIGGERS):
            _process_line(facts, state, parsed_at(index), first_seq + index)


def _frame_line(state: LauncherState, parsed, seq: int) -> None:
    found = _FRAME.match(parsed.body)
    if not found:
        return
    path, line, func = (g.decode("utf-8", "replace") for g in found.groups())
    frames = state.frames.setdefault((parsed.host, parsed.rank), [])
    frames.append((seq, f"{os.path.basename(path)}:{line} in {func}"))
    del frames[:-_FRAMES_KEPT]


def innermost_frame(
    state: LauncherState, host: str | None, rank: int | None, seq: int
) -> str | None:
    """The traceback frame printed just above line `seq` by the same host and rank."""
    for frame_seq, text in reversed(state.frames.get((host, rank), [])):
        if frame_seq < seq:
            return text if seq - frame_seq <= _FRAME_REACH else None
    return None


def _process_line(facts: JobFacts, state: LauncherState, parsed, seq: int) -> None:
    body, host = parsed.body, parsed.host
    processes = facts.processes
    for stated in _WORLD_SIZE.finditer(body):
        size = int(next(g for g in stated.groups() if g))
        facts.world_size = max(size, facts.world_size or 0)
    if found := _TABLE_HOST.match(body):
        state.table_host = (seq, found.group(1).decode())
        return
    if found := _TABLE_RANK.match(body):
        state.table_rank = (seq, int(found.group(1)), int(found.group(2)))
        if state.table_host and seq - state.table_host[0] <= _TABLE_REACH:
            facts.host_of_rank[int(found.group(1))] = state.table_host[1]
        return
    if found := _TABLE_EXIT.match(body):
        if state.table_rank and seq - state.table_rank[0] <= _TABLE_REACH:
            _, rank, local_rank = state.table_rank
            table_host = state.table_host
            near = table_host is not None and seq - table_host[0] <= _TABLE_REACH + 1
            processes.note(
                int(found.group(2)),
                rank=rank,
                local_rank=local_rank,
                host=table_host[1] if near and table_host else host,
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
