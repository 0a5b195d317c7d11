"""The regex context around a required literal, compiled to a tiny program for the prefilter.

A literal hit passes when the pattern's items just before and after that literal can match
there; the native matcher runs these programs in C so that `re` sees fewer lines. A context is a
necessary condition only: whatever it cannot express (assertions, long programs) it accepts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from denpex._native.literals import _MAXREPEAT, _score, parse_bytes, split_flags, sre_c

# opcodes of a context program: (op, a, b, c); REP matches a byte set a, b to c times (c = -1:
# unbounded) and backtracks over the count; SPLIT tries a then b; a cut context ends in ACCEPT
CHAR, REP, SPLIT, JMP, ACCEPT = 0, 1, 2, 3, 4
MAX_PROGRAM = 256  # instructions per direction; a longer context is cut there (accepts)
_NOT_NEWLINE = frozenset(range(256)) - {10}
_CATEGORIES = {
    sre_c.CATEGORY_DIGIT: frozenset(range(48, 58)),
    sre_c.CATEGORY_NOT_DIGIT: frozenset(range(256)) - frozenset(range(48, 58)),
    sre_c.CATEGORY_SPACE: frozenset(b" \t\n\r\f\v"),
    sre_c.CATEGORY_NOT_SPACE: frozenset(range(256)) - frozenset(b" \t\n\r\f\v"),
    sre_c.CATEGORY_WORD: frozenset(
        b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_"
    ),
}
_CATEGORIES[sre_c.CATEGORY_NOT_WORD] = frozenset(range(256)) - _CATEGORIES[sre_c.CATEGORY_WORD]


@dataclass
class Program:
    """Instructions (op, a, b, c) and the byte sets they name (each a frozenset of bytes)."""

    code: list[tuple[int, int, int, int]] = field(default_factory=list)
    sets: list[frozenset[int]] = field(default_factory=list)
    _set_ids: dict[frozenset[int], int] = field(default_factory=dict)

    def set_id(self, members: frozenset[int]) -> int:
        if members not in self._set_ids:
            self._set_ids[members] = len(self.sets)
            self.sets.append(members)
        return self._set_ids[members]


def _items(sub) -> list:
    """The items of a parsed (sub)pattern as a plain list (SubPattern indexing is slow)."""
    return sub.data if hasattr(sub, "data") else list(sub)


def _fold(members: frozenset[int], ignorecase: bool) -> frozenset[int]:
    if not ignorecase:
        return members
    extra = {c ^ 0x20 for c in members if 65 <= c <= 90 or 97 <= c <= 122}
    return members | extra


def _char_set(op, av, ignorecase: bool) -> frozenset[int] | None:
    if op is sre_c.LITERAL:
        return _fold(frozenset((av,)), ignorecase)
    if op is sre_c.NOT_LITERAL:
        return frozenset(range(256)) - _fold(frozenset((av,)), ignorecase)
    if op is sre_c.ANY:
        return _NOT_NEWLINE
    if op is sre_c.IN:
        members: set[int] = set()
        negate = False
        for mop, mav in av:
            if mop is sre_c.NEGATE:
                negate = True
            elif mop is sre_c.LITERAL:
                members.add(mav)
            elif mop is sre_c.RANGE:
                members.update(range(mav[0], mav[1] + 1))
            elif mop is sre_c.CATEGORY and mav in _CATEGORIES:
                members.update(_CATEGORIES[mav])
            else:
                return None
        folded = _fold(frozenset(members), ignorecase)
        return frozenset(range(256)) - folded if negate else folded
    return None


class _Compiler:
    """Emits one direction of a context; every method returns False where it cut the rest."""

    def __init__(self, program: Program, ignorecase: bool, backward: bool) -> None:
        self.program, self.ignorecase, self.backward = program, ignorecase, backward
        self.start = len(program.code)

    @property
    def here(self) -> int:
        return len(self.program.code)

    def full(self) -> bool:
        return self.here - self.start >= MAX_PROGRAM

    def emit(self, op: int, a: int = 0, b: int = 0, c: int = 0) -> int:
        self.program.code.append((op, a, b, c))
        return self.here - 1

    def patch(self, at: int, b: int) -> None:
        op, a, _, c = self.program.code[at]
        self.program.code[at] = (op, a, b, c)

    def cut(self, pending: list[int]) -> bool:
        """Accept from here, and on every pending SPLIT's other way too."""
        accept = self.emit(ACCEPT)
        for split in pending:
            self.patch(split, accept)
        return False

    def sequence(self, items) -> bool:
        for op, av in reversed(items) if self.backward else items:
            if self.full() or not self.item(op, av):
                return False
        return True

    def item(self, op, av) -> bool:
        members = _char_set(op, av, self.ignorecase)
        if members is not None:
            self.emit(CHAR, self.program.set_id(members))
            return True
        if op is sre_c.AT:
            return True  # assertions are not checked: accepting more is always safe
        if op is sre_c.SUBPATTERN:
            return self.sequence(_items(av[-1]))
        if op is sre_c.BRANCH:
            return self.branch([_items(b) for b in av[1]])
        if op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT):
            return self.repeat(av[0], av[1], _items(av[2]))
        return False

    def branch(self, branches) -> bool:
        jumps = []
        for index, branch in enumerate(branches):
            split = self.emit(SPLIT, self.here + 1) if index < len(branches) - 1 else None
            if not self.sequence(branch):
                self.emit(ACCEPT)
            jumps.append(self.emit(JMP))
            if split is not None:
                self.patch(split, self.here)
        for jump in jumps:
            op, _, b, c = self.program.code[jump]
            self.program.code[jump] = (op, self.here, b, c)
        return True

    def repeat(self, low: int, high: int, body) -> bool:
        members = _char_set(body[0][0], body[0][1], self.ignorecase) if len(body) == 1 else None
        if members is not None:
            self.emit(REP, self.program.set_id(members), low, -1 if high == _MAXREPEAT else high)
            return True
        for _ in range(low):
            if self.full() or not self.sequence(body):
                return self.cut([])
        if high == _MAXREPEAT:
            loop = self.emit(SPLIT, self.here + 1)
            if not self.sequence(body):
                return self.cut([loop])
            self.emit(JMP, loop)
            self.patch(loop, self.here)
            return True
        splits: list[int] = []
        for _ in range(high - low):
            splits.append(self.emit(SPLIT, self.here + 1))
            if self.full() or not self.sequence(body):
                return self.cut(splits)
        for split in splits:
            self.patch(split, self.here)
        return True


def _compile_side(program: Program, frames, ignorecase: bool, backward: bool) -> int:
    """One direction: from the literal outwards through the enclosing sequences."""
    compiler = _Compiler(program, ignorecase, backward)
    for items, begin, end, leaves_repeat in frames:
        side = items[:begin] if backward else items[end:]
        if not compiler.sequence(side) or leaves_repeat:
            break
    compiler.emit(ACCEPT)
    return compiler.start


def _finite(op, av, ignorecase: bool, cap: int) -> set[bytes] | None:
    """Every byte string the item can match, when they are few (at most `cap`), else None."""
    if op is sre_c.AT:
        return {b""}
    members = _char_set(op, av, ignorecase)
    if members is not None:
        if ignorecase:
            members = frozenset(bytes((c,)).lower()[0] for c in members)
        return {bytes((c,)) for c in members} if len(members) <= 4 else None
    if op is sre_c.SUBPATTERN:
        return _finite_sequence(_items(av[-1]), ignorecase, cap)
    if op is sre_c.BRANCH:
        union: set[bytes] = set()
        for branch in av[1]:
            strings = _finite_sequence(_items(branch), ignorecase, cap)
            if strings is None or len(union | strings) > cap:
                return None
            union |= strings
        return union
    if op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT) and av[1] != _MAXREPEAT and av[1] <= 4:
        body = _finite_sequence(_items(av[2]), ignorecase, cap)
        if body is None:
            return None
        strings, power = ({b""} if av[0] == 0 else set()), {b""}
        for count in range(1, av[1] + 1):
            power = {x + y for x in power for y in body}
            if len(power) > cap:
                return None
            if count >= av[0]:
                strings |= power
        return strings if len(strings) <= cap else None
    return None


def _finite_sequence(items, ignorecase: bool, cap: int) -> set[bytes] | None:
    product = {b""}
    for op, av in items:
        strings = _finite(op, av, ignorecase, cap)
        if strings is None:
            return None
        product = {x + y for x in product for y in strings}
        if len(product) > cap:
            return None
    return product


Sites = dict  # literal -> frames of every place it can occur (innermost first)


def _candidates(items, ignorecase: bool, outer: list, cap: int) -> list[Sites]:
    """Required literal sets of a sequence: one of each set's strings is in every match."""
    finite = [_finite(op, av, ignorecase, cap) for op, av in items]
    found: list[Sites] = []
    begin = 0
    while begin < len(items):  # the longest runs of finite items (sliding where `cap` cut one)
        product, end = {b""}, begin
        while end < len(items) and (options := finite[end]) is not None:
            longer = {x + y for x in product for y in options}
            if len(longer) > cap:
                break
            product, end = longer, end + 1
        if b"" not in product:
            frames = [(items, begin, end, False), *outer]
            found.append({literal: [frames] for literal in product})
        cut = end < len(items) and finite[end] is not None
        begin = begin + 1 if cut or end == begin else end
    for index, (op, av) in enumerate(items):
        frame = (items, index, index + 1, False)
        if op is sre_c.SUBPATTERN:
            found.extend(_candidates(_items(av[-1]), ignorecase, [frame, *outer], cap))
        elif op is sre_c.BRANCH:
            merged: Sites = {}
            for branch in av[1]:
                best = _best(_candidates(_items(branch), ignorecase, [frame, *outer], cap), 1)
                if best is None:
                    break
                for literal, sites in best.items():
                    merged.setdefault(literal, []).extend(sites)
            else:
                found.append(merged)
        elif op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT) and av[0] >= 1:
            leaves = (items, index, index + 1, av[1] != 1)
            found.extend(_candidates(_items(av[2]), ignorecase, [leaves, *outer], cap))
    return found


@lru_cache(maxsize=65536)
def _worth(literal: bytes) -> int:
    return _score((literal,))[0]


def _best(candidates: list[Sites], min_length: int) -> Sites | None:
    best, best_score = None, None
    for candidate in candidates:
        if min(map(len, candidate)) < min_length:
            continue
        score = (min(map(_worth, candidate)), -len(candidate))
        if best_score is None or score > best_score:
            best, best_score = candidate, score
    return best


def prefilter_plan(pattern: str, min_length: int = 1, cap: int = 64) -> tuple[bool, Sites] | None:
    """(ignorecase, literal -> its sites): one of the literals is in every line that matches.

    Literals may span several items (`(?:Runtime|Value)Error: ` gives two), which makes them
    longer and rarer than single runs; at most `cap` of them, none shorter than `min_length`.
    """
    body, ignorecase = split_flags(pattern)
    best = _best(_candidates(_items(parse_bytes(body)), ignorecase, [], cap), min_length)
    return None if best is None else (ignorecase, best)


def site_contexts(sites: list, ignorecase: bool, program: Program) -> list[tuple[int, int]]:
    """(head entry, tail entry) in `program` for each site of one literal.

    The head program runs backwards from the literal's first byte, the tail forwards from
    just after it; a hit is worth confirming when, for some site, both reach ACCEPT.
    """
    contexts = []
    for frames in sites:
        # a site inside a repeat that may run again: its context ends with the repeat's body
        adjusted = [
            (items, begin, end, index + 1 < len(frames) and frames[index + 1][3])
            for index, (items, begin, end, _) in enumerate(frames)
        ]
        head = _compile_side(program, adjusted, ignorecase, backward=True)
        tail = _compile_side(program, adjusted, ignorecase, backward=False)
        contexts.append((head, tail))
    return contexts


def run(program: Program, entry: int, data: bytes, pos: int, backward: bool) -> bool:
    """Run one direction of a context at `pos` (the C engine's twin, for tests)."""
    stack: list[tuple[int, int]] = [(entry, pos)]
    while stack:
        pc, at = stack.pop()
        while True:
            op, a, b, c = program.code[pc]
            if op == ACCEPT:
                return True
            if op == JMP:
                pc = a
            elif op == SPLIT:
                stack.append((b, at))
                pc = a
            elif op == CHAR:
                index = at - 1 if backward else at
                if not 0 <= index < len(data) or data[index] not in program.sets[a]:
                    break
                at += -1 if backward else 1
                pc += 1
            else:  # REP
                count = 0
                while c < 0 or count < c:
                    index = at - 1 - count if backward else at + count
                    if not 0 <= index < len(data) or data[index] not in program.sets[a]:
                        break
                    count += 1
                if count < b:
                    break
                step = -1 if backward else 1
                stack.extend((pc + 1, at + step * k) for k in range(b, count))
                at += step * count
                pc += 1
    return False


@dataclass(slots=True)
class MatcherPlan:
    """What the native matcher builds its tables from, a function of the patterns alone: the
    prefilter's literals (bytes, ignorecase), for each literal its patterns with the (head,
    tail) contexts of its sites, the context program, and the patterns without a literal.
    Plain data (`to_data`/`from_data`), so a caller may keep it and skip computing it."""

    literals: list[tuple[bytes, bool]]
    literal_patterns: list[dict[int, list[tuple[int, int]]]]
    program: Program
    always: list[int]

    def to_data(self) -> dict:
        """JSON-able: literals as Latin-1 text (one character a byte)."""
        return {
            "literals": [[literal.decode("latin-1"), case] for literal, case in self.literals],
            "literal_patterns": [
                [[index, [list(c) for c in contexts]] for index, contexts in by_pattern.items()]
                for by_pattern in self.literal_patterns
            ],
            "code": [list(instruction) for instruction in self.program.code],
            "sets": [sorted(members) for members in self.program.sets],
            "always": self.always,
        }

    @classmethod
    def from_data(cls, data: dict) -> MatcherPlan:
        """The plan `to_data` gave; KeyError, TypeError or ValueError for anything else."""
        program = Program()
        for members in data["sets"]:
            program.set_id(frozenset(int(m) for m in members))
        program.code = [(int(o), int(a), int(b), int(c)) for o, a, b, c in data["code"]]
        return cls(
            literals=[(text.encode("latin-1"), bool(case)) for text, case in data["literals"]],
            literal_patterns=[
                {int(index): [(int(h), int(t)) for h, t in contexts] for index, contexts in row}
                for row in data["literal_patterns"]
            ],
            program=program,
            always=[int(i) for i in data["always"]],
        )


def matcher_plan(patterns: list[str], long_literal: int) -> MatcherPlan:
    """The plan of `patterns`: each keyed on literals of at least `long_literal` bytes when it
    has them (they hold a window the fast scan finds), else on its best shorter ones."""
    literal_ids: dict[tuple[bytes, bool], int] = {}
    literal_patterns: list[dict[int, list[tuple[int, int]]]] = []
    program = Program()
    always: list[int] = []
    for index, pattern in enumerate(patterns):
        plan = prefilter_plan(pattern, long_literal) or prefilter_plan(pattern, 1)
        if plan is None:
            always.append(index)
            continue
        ignorecase, sites = plan
        for literal, frames in sites.items():
            key = (literal, ignorecase)
            if key not in literal_ids:
                literal_ids[key] = len(literal_patterns)
                literal_patterns.append({})
            literal_patterns[literal_ids[key]][index] = site_contexts(frames, ignorecase, program)
    return MatcherPlan(list(literal_ids), literal_patterns, program, always)
