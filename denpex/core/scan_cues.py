"""What a scan looks for beside the catalog's signatures: the words of the lines that say who
is who, and the non-finite values the series sampler never skips.

The catalog's matcher finds them in its own pass over each batch (a pass of their own cost a
scan about a seventh of its time) and reports them apart from its matches
(`Catalog.scan_joined`). They are defined here, below the catalog that matches them and the
readers that use them (denpex.lite.processes, denpex.lite.scanner, denpex.series.sampling),
so that each of them can import the one definition.
"""

from __future__ import annotations

import re

from denpex.core.sdk_wire import STDERR_PREFIX

# NCCL's "comm 0x… rank 13 nranks 16 cudaDev 5 nvmlDev 5 busId 3b000": the world size
NRANKS = b" nranks "
# torchrun's failure table: `exitcode : -9 (pid: N)`, read only after its `rank :` line
TABLE_EXIT = b"(pid: "
# the lines the launcher learner parses (denpex.lite.processes): summaries of local ranks,
# DeepSpeed's `Killing subprocess N`, stated world sizes
LAUNCHER_WORDS = (b"local_rank", b"Killing subprocess", b"orld_size", b"WORLD_SIZE", NRANKS)
# ... and what the scanner reads itself: a GPU's bus id on NCCL's comm line, srun's failed
# tasks, the SDK's stderr lines. Not " NCCL ": only whether a batch holds one matters, and on
# a chatty job it is on so many lines that listing them costs more than the whole pass
WORDS = (*LAUNCHER_WORDS, TABLE_EXIT, b"busId", b"srun: error: ", STDERR_PREFIX)
# A value NaN or Inf right after a key (`loss=nan`, `'loss': nan`, `lm loss: NAN`, `loss nan`,
# JSON's `NaN`/`Infinity`): each 3-byte spelling is a literal the matcher's prefilter keys on
NONFINITE_PATTERN = r"""(?:[:=]|loss) ?['"]?[-+]?(?:nan|NaN|NAN|inf|Inf|INF)(?:inity|INITY)?\b"""
# the patterns matched after the catalog's: WORDS in order, then NONFINITE_PATTERN
PATTERNS = (*(re.escape(word.decode()) for word in WORDS), NONFINITE_PATTERN)
NONFINITE = len(WORDS)  # the index of NONFINITE_PATTERN in PATTERNS
