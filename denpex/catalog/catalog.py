"""The compiled catalog: every signature behind one multi-pattern matcher.

The matcher comes from `denpex._native` (the compiled engine when built, the pure-Python
reference otherwise); both give identical answers, which the tests check on every example.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from types import ModuleType

import denpex._native as native
import denpex.catalog.cache as kept_catalog
from denpex._native.contexts import MatcherPlan
from denpex.catalog.loader import builtin_catalog_files, load_signatures
from denpex.catalog.schema import Signature, template_fields
from denpex.core.detectors import Detector, detector_catalog
from denpex.core.scan_cues import PATTERNS as CUES


@dataclass(slots=True)
class Match:
    line_index: int
    signature: Signature


class Catalog:
    """Signatures plus the matcher built over their patterns, and the detectors (evidence
    ids that are not regex matches) beside them: together, every id denpex reports. The
    matcher also finds a scan's cues (denpex.core.scan_cues) in the same pass, after the
    signatures' patterns; only `scan_joined` reports them."""

    def __init__(
        self,
        signatures: list[Signature],
        matcher_module: ModuleType | None = None,
        detectors: Mapping[str, Detector] | None = None,
        plan: MatcherPlan | None = None,
    ):
        """`plan`: the native matcher's plan of these signatures' patterns and the cues (its
        `plan` attribute, kept from an earlier catalog of them), or None to compute it."""
        self.signatures = signatures
        self.by_id = {s.id: s for s in signatures}
        self.detectors = dict(detector_catalog() if detectors is None else detectors)
        module = matcher_module or native.load("matcher")
        self.backend = "reference" if module.__name__.endswith("_ref") else "native"
        self._matcher = module.Matcher([*(s.pattern for s in signatures), *CUES], plan)
        self.plan: MatcherPlan | None = self._matcher.plan
        self._cues_from = len(signatures)  # the matcher's index of the first cue

    def __len__(self) -> int:
        return len(self.signatures)

    def explanations(self) -> dict[str, str]:
        """Signature or detector id → what it means and what to do: the explanation a
        diagnosis gives of its root cause and the reason of its actions."""
        explained = {d.id: d.explain for d in self.detectors.values()}
        explained.update((s.id, s.explain) for s in self.signatures)
        return explained

    def match_lines(self, lines: list[bytes]) -> list[Match]:
        """Every (line, signature) match over `lines`, in line order."""
        first_cue, signatures = self._cues_from, self.signatures
        return [
            Match(li, signatures[pi])
            for li, pi in self._matcher.scan_lines(lines)
            if pi < first_cue
        ]

    def match_joined(self, joined: bytes) -> list[Match]:
        """Every (line, signature) match over lines joined by b"\\n" (none of them holding
        one), in line order: the same as match_lines on them, without a list of lines."""
        return self.scan_joined(joined)[0]

    def scan_joined(self, joined: bytes) -> tuple[list[Match], list[tuple[int, int]]]:
        """match_joined, and the scan's cues found in the same pass: (line index, index in
        denpex.core.scan_cues.PATTERNS), in line order."""
        first_cue, signatures = self._cues_from, self.signatures
        matches, cues = [], []
        for li, pi in self._matcher.scan(joined):
            if pi < first_cue:
                matches.append(Match(li, signatures[pi]))
            else:
                cues.append((li, pi - first_cue))
        return matches, cues

    def example_errors(self) -> list[str]:
        """Examples that disagree with the compiled matcher, and summary fields that no
        example captures: 'file:line: id: message'."""
        problems: list[str] = []
        for index, sig in enumerate(self.signatures):
            where = f"{sig.file}:{sig.line}: {sig.id}"
            captured: set[str] = set()
            for text in sig.examples_match:
                captured.update(sig.captures(text.encode("utf-8")))
            for name in template_fields(sig.summary):
                if name not in captured:
                    problems.append(f"{where}: no match example captures {{{name}}}")
            for text in sig.examples_match:
                hits = self._matcher.scan_lines([text.encode("utf-8")])
                if (0, index) not in hits:
                    problems.append(f"{where}: does not match its example {text!r}")
            for text in sig.examples_no_match:
                hits = self._matcher.scan_lines([text.encode("utf-8")])
                if (0, index) in hits:
                    problems.append(f"{where}: matches its counter-example {text!r}")
        return problems


def load_catalog(paths: Iterable[str] | None = None, *, local: Iterable[str] = ()) -> Catalog:
    """The catalog from `paths` (default: the built-in one, cached) plus site-local folders,
    whose entries override shipped ones by id."""
    local = list(local)
    if paths is None and not local:
        return _builtin_catalog(native.backend("matcher"))
    return Catalog(load_signatures(paths, local=local))


@cache
def _builtin_catalog(backend: str) -> Catalog:
    # one per matcher backend: DENPEX_NO_EXTENSIONS may change between calls (the tests run
    # both backends in one process)
    files = builtin_catalog_files()
    kept = kept_catalog.read(files)
    if kept is not None:
        return Catalog(kept.signatures, plan=kept.plan)
    catalog = Catalog(load_signatures(files))
    kept_catalog.write(files, catalog.signatures, catalog.plan)
    return catalog
