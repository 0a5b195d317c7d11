"""Messages processes exchange over the wire (DESIGN §2): JSON-able dataclasses, no I/O.

`Registration` is what `denpex run` (or the SDK) tells a node agent about a job process so
that the agent's evidence for that pid or cgroup carries the job, rank and tenant.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any


class WireError(ValueError):
    """A message that does not have the fields and types its kind requires."""


@dataclass(frozen=True, slots=True)
class Registration:
    pid: int
    job: str | None = None
    rank: int | None = None
    tenant: str | None = None
    cgroup: str | None = None  # as /proc/<pid>/cgroup names it, e.g. "/slurm/uid_0/job_42"
    started_ns: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, data: Any) -> Registration:
        if not isinstance(data, dict):
            raise WireError("a registration is a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise WireError(f"unknown registration field(s): {', '.join(unknown)}")
        pid = data.get("pid")
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
            raise WireError("registration needs a positive integer 'pid'")
        for name in ("rank", "started_ns"):
            value = data.get(name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise WireError(f"registration field {name!r} must be an integer")
        for name in ("job", "tenant", "cgroup"):
            value = data.get(name)
            if value is not None and not isinstance(value, str):
                raise WireError(f"registration field {name!r} must be a string")
        return cls(**data)
