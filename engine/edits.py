"""In-line edits: the few small changes a model finds the code needs, each bounded to the
characters it fixes, for every backend (issue 48; docs/server.md, Next edit).

`suggest_edits(engine, request)` answers two questions about a document, and ranks the
answers together by how much the model prefers the text with the edit:

- **Refine** (`EditRequest.region`): what in this region is wrong? With a generator that
  can score text (`Scorer`: a local model with the one-token mode, which every model
  adapted from an autoregressive one has):
    1. score the region's tokens teacher-forced as the middle of a fill-in-the-middle
       prompt, the code before and after it around it (`Scorer.score`);
    2. the tokens the model finds unlikely (below SPOT_LOGPROB), the least likely first,
       are where a fix may start;
    3. from each, the model writes the rest of the region one token at a time
       (`Scorer.rewrite`), and stops as soon as what it writes agrees again with what is
       there (`realigned`: its differences from the text, from the first up to a run of
       ANCHOR_CHARS equal characters, or to the end of both); the edits that take the
       differences up to the first, the second, ... of them (MAX_OPTIONS), grown to whole
       words (`grown`), are the options where they have the shape of a fix (`is_fix`: a
       word or a few symbols, nothing deleted, not only blanks);
    4. the region with each option is scored again, and the one that makes it most likely
       is kept if it does by the margin (nats, `REFINE_MARGIN`) and parses no worse.
  A generator that cannot score (a remote engine, a canvas-only model) re-fills the region
  (the canvas refinement where the model has one) and the edit is bounded the same way:
  the one span where the fill differs from the text, grown to whole words.
- **Next edit** (`EditRequest.proposals`, `refills`): which of these replacements, proposed
  from what the developer just changed, does the model prefer? `implied` proposes the
  other places where the text that the edit replaced still stands, such as the other uses
  of a renamed name (judged together: each in the document with the others made); the
  server names places for the model to fill again, such as the argument lists of the
  calls of a function whose parameters the edit changed (`refilled_places`). Each is
  scored in its line, old against new, and kept where the new line is more likely by
  NEXT_MARGIN (the developer's own edit is evidence already: a smaller margin). Where an
  edit implies something, that is the answer; the region is refined only otherwise.

Nothing is returned where nothing is likely wrong: a false edit costs the developer more
than a missing one. No edit touches `EditRequest.protected` (what the developer just
wrote: undoing it is no suggestion). Edits never overlap; the best MAX_EDITS are
returned, best first.
"""

from __future__ import annotations

import difflib
import functools
import logging
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine.fill import InfillRequest
from engine.spans import Document, SignatureChange, count_errors, language_for
from engine.spans.document import common_prefix, common_suffix
from engine.spans.lines import line_end, line_start

log = logging.getLogger(__name__)

SPOT_LOGPROB = math.log(0.05)  # a region's token less likely than this may start a fix
MAX_SPOTS = 3  # the least likely tokens tried per region
ANCHOR_CHARS = 3  # a rewrite agrees again with the text once this many characters match
MAX_EDIT_CHARS = 40  # a refinement replaces at most this much of the old text
MAX_EDIT_WORDS = 1  # ... and at most one word (a name, a number) by at most one
MAX_OPTIONS = 3  # edits scored per spot: the rewrite's first differences, up to 1, 2, 3 of them
REWRITE_SLACK_TOKENS = 4  # a rewrite may run this many tokens past the region's rest
MAX_REWRITE_TOKENS = 24
REFINE_MARGIN = 3.0  # nats: a refinement's edit must make its region this much more likely
NEXT_MARGIN = 1.0  # nats: a proposed next edit must make its line this much more likely
MAX_EDITS = 3
JUDGE_CONTEXT_TOKENS = 192  # the code around a line that judging a replacement in it reads (the text nearby decides)
MAX_PROPOSALS = 4  # the nearest other places an edit implies, judged per request (the next ask judges more)
MIN_SPELLED_CHARS = 3  # shorter names are not spell-checked
MAX_SPELLING_DISTANCE = 2  # a misspelling is this many slips from a name the document holds
MAX_SPELLINGS = 3  # the nearest names tried for one
_WORD = re.compile(r"\w")
_WORDS = re.compile(r"\w+")
_CLOSING = re.compile(r"[)\]}>;,:\s]+")
_NAMES = re.compile(r"(?<![\w$])[A-Za-z_$][\w$]*")


@dataclass(frozen=True)
class Replacement:
    """text[start:end] replaced by `text` (offsets in the document)."""

    start: int
    end: int
    text: str


@dataclass(frozen=True)
class Slot:
    """A place the model fills: text[start:end] (empty: an insertion) replaced by `lead`,
    the model's text, then `tail` (`, ` before a new argument)."""

    start: int
    end: int
    lead: str = ""
    tail: str = ""


@dataclass(frozen=True)
class Edit(Replacement):
    """A suggested replacement and how much more likely the model finds the text with it
    (`gain`, nats; None where the generator cannot score: a remote engine's re-fill)."""

    gain: float | None = None
    source: str = "refine"  # "refine" (what the region needs) or "next" (what an edit implies)

    @property
    def confidence(self) -> float | None:
        """The model's odds for the new text over the old, as a probability (sigmoid of
        the gain): 0.5 is a tie."""
        return None if self.gain is None else 1.0 / (1.0 + math.exp(-max(-50.0, min(50.0, self.gain))))


@dataclass(frozen=True)
class EditRequest:
    """What to look at: the document, where to refine (`region`: offsets; None: nowhere),
    and replacements to judge (`proposals`: what the developer's last edit implies)."""

    text: str
    language: str | None = None
    region: tuple[int, int] | None = None
    proposals: Sequence[Replacement] = ()
    margin: float | None = None  # nats for both kinds; None: REFINE_MARGIN and NEXT_MARGIN
    protected: tuple[int, int] | None = None  # no edit touches this (what the developer just wrote)
    # places the model fills, given the developer's last edit (a new argument in the calls
    # of a function it gave a parameter: `signature_edits`), the nearest first
    refills: Sequence[Slot] = ()
    most: int = MAX_EDITS


@dataclass
class Scored:
    """A region scored as the middle of a fill: each token's start in the region's text and
    log-probability, then end-of-fill's (`logprobs` has one more entry than `starts`)."""

    starts: list[int]
    logprobs: list[float]
    total: float = field(init=False)

    def __post_init__(self) -> None:
        self.total = float(sum(self.logprobs))


class Scorer(Protocol):
    """What a generator offers for refinement: a region's likelihood in its context, and the
    rest of a region written by the model from one of its tokens on."""

    def score(self, prefix: str, region: str, suffix: str, context_tokens: int | None = None) -> Scored:
        """The region's tokens scored between `prefix` and `suffix`, of which the scorer
        reads `context_tokens` (None: as much as it reads by default)."""
        ...

    def rewrite(
        self,
        prefix: str,
        region: str,
        token: int,
        suffix: str,
        most: int,
        done: Callable[[str], bool],
        context_tokens: int | None = None,
    ) -> str:
        """The model's greedy text in place of the region from its token `token` on (the
        tokens before it given), at most `most` tokens, until end-of-fill or `done(text)`;
        `context_tokens` as `score`'s."""
        ...


class Checked(Protocol):
    """What `suggest_edits` needs of the engine (engine.fill.Engine)."""

    generator: Any

    def fill(self, req: Any, control: Any = None) -> Any: ...


def suggest_edits(engine: Checked, req: EditRequest, control: Any = None) -> list[Edit]:
    """The edits the model suggests (module docstring), best first, none overlapping."""
    cancelled: Callable[[], bool] = getattr(control, "cancel", None) or (lambda: False)
    scorer: Scorer | None = getattr(engine.generator, "scorer", None)
    found: list[Edit] = []
    if req.proposals and scorer is not None:
        margin = NEXT_MARGIN if req.margin is None else req.margin
        implied_edits = judged(scorer, req.text, req.proposals, together=True)
        found += [e for e in implied_edits if e.gain is not None and e.gain >= margin]
    if req.refills and scorer is not None and not cancelled():
        margin = NEXT_MARGIN if req.margin is None else req.margin
        calls = judged(scorer, req.text, refilled_places(scorer, req.text, req.refills[:MAX_PROPOSALS], cancelled))
        found += [e for e in calls if e.gain is not None and e.gain >= margin]
    implications = req.proposals or req.refills
    if req.region is not None and not implications and not cancelled():  # an edit's implications come first
        if scorer is not None:
            margin = NEXT_MARGIN if req.margin is None else req.margin
            names = judged(scorer, req.text, misspelled(req.text, req.region), source="spelling")
            found += [e for e in names if (e.gain or 0.0) >= margin]
            margin = REFINE_MARGIN if req.margin is None else req.margin
            found += [e for e in refined(scorer, req.text, req.region, cancelled) if (e.gain or 0.0) >= margin]
        else:
            found += refilled(engine, req, control)
    if req.protected is not None:
        lo, hi = req.protected
        found = [e for e in found if e.end < lo or e.start > hi]
    return best(req.text, req.language, found, req.most)


def best(text: str, language: str | None, edits: list[Edit], most: int) -> list[Edit]:
    """The `most` best edits that change something, parse no worse and overlap none better."""
    doc = Document(text, language_for(language)) if language else None
    before = count_errors(doc.tree) if doc is not None and doc.tree is not None else 0
    kept: list[Edit] = []
    ranked = sorted(edits, key=lambda e: -(e.gain if e.gain is not None else 0.0))
    for e in ranked:
        if len(kept) >= most:
            break
        if text[e.start : e.end] == e.text or any(e.start < k.end and k.start < e.end for k in kept):
            continue
        tree = doc.with_insert(e.end, e.text, e.start) if doc is not None else None
        if tree is not None and count_errors(tree) > before:
            continue
        kept.append(e)
    return kept


def refined(scorer: Scorer, text: str, region: tuple[int, int], cancelled: Callable[[], bool]) -> list[Edit]:
    """Refinement with a scorer (steps 1-4 of the module docstring): at each spot, of the
    edits that take the rewrite's differences up to one of them, the one that makes the
    region most likely (the caller drops it below the margin)."""
    a, b = region
    prefix, body, suffix = text[:a], text[a:b], text[b:]
    if not body.strip():
        return []
    scored = scorer.score(prefix, body, suffix)
    tokens = len(scored.starts)
    spots = sorted((i for i in range(tokens) if scored.logprobs[i] < SPOT_LOGPROB), key=lambda i: scored.logprobs[i])
    out: list[Edit] = []
    for i in spots[:MAX_SPOTS]:
        at = scored.starts[i]
        if cancelled() or any(a + at < e.end and e.start <= a + at for e in out):
            continue
        rest = body[at:]
        most = min(MAX_REWRITE_TOKENS, tokens - i + REWRITE_SLACK_TOKENS)
        written = scorer.rewrite(prefix, body, i, suffix, most, functools.partial(_settled, rest))
        tried: set[tuple[int, int, str]] = set()
        options: list[Edit] = []
        for change in realigned(rest, written, complete=True)[:MAX_OPTIONS]:
            lo, hi, new = grown(body, at + change[0], at + change[1], change[2])
            if not is_fix(body[lo:hi], new) or (lo, hi, new) in tried or _renames_a_known_name(text, body[lo:hi]):
                continue
            tried.add((lo, hi, new))
            gain = scorer.score(prefix, body[:lo] + new + body[hi:], suffix).total - scored.total
            log.debug("refine: %r -> %r, gain %.2f", body[lo:hi], new, gain)
            options.append(Edit(a + lo, a + hi, new, gain, "refine"))
        if options:  # the most likely of them (ties: the smallest, the first)
            out.append(max(options, key=lambda e: e.gain or 0.0))
    return out


def is_fix(old: str, new: str) -> bool:
    """Whether replacing `old` with `new` has the shape of a fix: at most MAX_EDIT_CHARS of
    old text; at most MAX_EDIT_WORDS word (a name, a number) for at most as many, none
    dropped (a model finds shorter code likelier: deleting what it does not expect is not a
    fix); not only a change of blanks (layout is the formatter's business)."""
    if len(old) > MAX_EDIT_CHARS or "".join(old.split()) == "".join(new.split()):
        return False
    words_old, words_new = len(_WORDS.findall(old)), len(_WORDS.findall(new))
    return words_old <= MAX_EDIT_WORDS and words_new <= MAX_EDIT_WORDS and words_new >= words_old


def _renames_a_known_name(text: str, old: str) -> bool:
    """Whether `old` holds a name that the document uses elsewhere too: a name in use is
    the developer's choice, and a model that would write another there has another idea,
    not a fix (a misspelled or a stale name stands alone: `misspelled`, next edits)."""
    return any(
        len(re.findall(rf"(?<!\w){re.escape(w)}(?!\w)", text)) > 1 for w in _NAMES.findall(old)
    )  # fmt: skip


def misspelled(text: str, region: tuple[int, int]) -> list[Replacement]:
    """Names in the region that the document holds nowhere else, each with the document's
    names spelled like it (at most MAX_SPELLING_DISTANCE letters added, dropped, changed
    or swapped; at most MAX_SPELLINGS, the nearest first): a misspelling is a name that
    stands alone where a defined name is one slip away."""
    counts: dict[str, int] = {}
    for m in _NAMES.finditer(text):
        counts[m.group()] = counts.get(m.group(), 0) + 1
    known = [n for n, c in counts.items() if len(n) >= MIN_SPELLED_CHARS]
    out: list[Replacement] = []
    a, b = region
    for m in _NAMES.finditer(text, a, b):
        word = m.group()
        if counts[word] > 1 or len(word) < MIN_SPELLED_CHARS:
            continue
        near = sorted((d, n) for n in known if n != word and (d := distance(word, n)) <= MAX_SPELLING_DISTANCE)
        out += [Replacement(m.start(), m.end(), n) for _, n in near[:MAX_SPELLINGS]]
    return out


def distance(a: str, b: str) -> int:
    """Letters added, dropped, changed or swapped (optimal string alignment distance),
    counted no further than MAX_SPELLING_DISTANCE + 1."""
    if abs(len(a) - len(b)) > MAX_SPELLING_DISTANCE:
        return MAX_SPELLING_DISTANCE + 1
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        row = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            row[j] = min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                row[j] = min(row[j], prev2[j - 2] + 1)
        prev2, prev = prev, row
    return min(prev[len(b)], MAX_SPELLING_DISTANCE + 1)


def _settled(rest: str, written: str) -> bool:
    """Whether a rewrite can stop: it agrees with the text again, or has gone past its lines."""
    return bool(realigned(rest, written)) or written.count("\n") > rest.count("\n")


def judged(
    scorer: Scorer, text: str, proposals: Sequence[Replacement], together: bool = False, source: str = "next"
) -> list[Edit]:
    """Each proposal scored in its line, old against new (before the margin). `together`:
    each in the document with the others made (the consistent world its edit implies: a
    rename's other uses renamed, so that the old name does not look right for being used
    around it); else each in the document as it is (alternatives for one place)."""
    out = []
    for p in proposals:
        world = text
        if together:
            for q in sorted((q for q in proposals if q is not p), key=lambda q: -q.start):
                world = world[: q.start] + q.text + world[q.end :]
        start = p.start + sum(len(q.text) - (q.end - q.start) for q in proposals if together and q.end <= p.start)
        end = start + (p.end - p.start)
        lo, hi = line_start(world, start), line_end(world, end)
        old = world[lo:hi]
        new = old[: start - lo] + p.text + old[end - lo :]
        before = scorer.score(world[:lo], old, world[hi:], JUDGE_CONTEXT_TOKENS).total
        after = scorer.score(world[:lo], new, world[hi:], JUDGE_CONTEXT_TOKENS).total
        out.append(Edit(p.start, p.end, p.text, after - before, source))
    return out


def refilled_places(
    scorer: Scorer, text: str, places: Sequence[Slot], cancelled: Callable[[], bool]
) -> list[Replacement]:
    """Each slot filled by the model (its greedy fill between the text before it and its
    lead, and its tail and the text after it; at most as many lines as it replaces), where
    that changes the text: the one span that differs, grown to whole words."""
    out = []
    for slot in places:
        if cancelled():
            break
        lo, hi = slot.start, slot.end
        old, after = text[lo:hi], slot.tail + text[hi:]
        lines = old.count("\n")
        done = functools.partial(_past_lines, lines)
        written = scorer.rewrite(text[:lo] + slot.lead, old, 0, after, MAX_REWRITE_TOKENS, done, JUDGE_CONTEXT_TOKENS)
        written = _without_echo(within_lines(written, lines), after)
        new = slot.lead + written + slot.tail
        if written.strip() and new != old:
            a, b, changed = grown(old, *difference(old, new))  # only where it differs
            out.append(Replacement(lo + a, lo + b, changed))
    return out


def signature_edits(change: SignatureChange) -> tuple[list[Replacement], list[Slot]]:
    """What a changed parameter list implies at the function's calls: a parameter removed,
    the argument at its place dropped with its comma (proposals, judged together); one
    added, a slot for the model to fill at its place (with a comma). Only calls with one
    argument more (removed) or fewer (added) than it has parameters now."""
    removals: list[Replacement] = []
    slots: list[Slot] = []
    for (inside_lo, _inside_hi), args in change.calls:
        if change.removed is not None and len(args) == change.params + 1:
            k = change.removed
            if k >= len(args):
                continue
            if k > 0:
                removals.append(Replacement(args[k - 1][1], args[k][1], ""))
            elif len(args) > 1:
                removals.append(Replacement(args[0][0], args[1][0], ""))
            else:
                removals.append(Replacement(args[0][0], args[0][1], ""))
        elif change.added is not None and len(args) == change.params - 1:
            k = min(change.added, len(args))
            if k > 0:
                slots.append(Slot(args[k - 1][1], args[k - 1][1], ", "))
            elif args:
                slots.append(Slot(args[0][0], args[0][0], "", ", "))
            else:
                slots.append(Slot(inside_lo, inside_lo))
    return removals, slots


def _without_echo(written: str, suffix: str) -> str:
    """`written` without the closing brackets and punctuation at its end that the text after
    it begins with already (a fill of `f(...)`'s arguments that writes the `)` again)."""
    head = suffix.split("\n", 1)[0]
    for k in range(len(head), 0, -1):
        if _CLOSING.fullmatch(head[:k]) and written.endswith(head[:k]):
            return written[: len(written) - k]
    return written


def _past_lines(lines: int, written: str) -> bool:
    return written.count("\n") > lines


def refilled(engine: Checked, req: EditRequest, control: Any) -> list[Edit]:
    """Refinement without a scorer: the region re-filled by the generator (its canvas
    refinement where it has one), the edit bounded to where the fill differs."""
    assert req.region is not None
    a, b = req.region
    region = req.text[a:b]
    fill = InfillRequest(req.text[:a], req.text[b:], req.language, region=region, refine=True)
    result = engine.fill(fill, control)
    new = next((c.text for c in result.candidates if c.text.strip()), "")
    if not new or new == region:
        return []
    lo, hi, text = difference(region, new)
    lo, hi, text = grown(region, lo, hi, text)
    if not is_fix(region[lo:hi], text):
        return []
    return [Edit(a + lo, a + hi, text, None, "refine")]


def difference(old: str, new: str) -> tuple[int, int, str]:
    """(start, end, text): the one span of `old` that `new` replaces, after their common
    start and end."""
    head = common_prefix(old, new)
    tail = common_suffix(old, new, head)
    return head, len(old) - tail, new[head : len(new) - tail]


def realigned(old: str, written: str, complete: bool = False) -> list[tuple[int, int, str]]:
    """Where `written` (the model's text in place of `old`) differs from `old`, from its
    first difference up to where they agree again: ANCHOR_CHARS equal characters after it,
    or, once `written` is `complete`, the end of both. The answer is each edit that takes
    the differences up to one of them, (start, end, text) in `old`'s offsets, smallest
    first; empty while they have not agreed again, or where they do not differ. Lines past
    as many as `old` holds are not `written`'s (the model went on past the region)."""
    written = within_lines(written, old.count("\n"))
    ops = difflib.SequenceMatcher(None, old, written, autojunk=False).get_opcodes()
    start: tuple[int, int] | None = None
    edits: list[tuple[int, int, str]] = []
    for tag, i1, i2, j1, j2 in ops:
        if tag != "equal":
            if start is None:
                start = (i1, j1)
            edits.append((start[0], i2, written[start[1] : j2]))
            continue
        if start is not None and (i2 - i1 >= ANCHOR_CHARS or (complete and i2 == len(old) and j2 == len(written))):
            return edits
    return edits if complete and start is not None and ops[-1][0] != "equal" else []


def within_lines(text: str, lines: int) -> str:
    """`text` up to its line break number `lines` + 1 (not included)."""
    at = -1
    for _ in range(lines + 1):
        at = text.find("\n", at + 1)
        if at == -1:
            return text
    return text[:at]


def grown(text: str, lo: int, hi: int, new: str) -> tuple[int, int, str]:
    """text[lo:hi] -> new, grown to whole words on each side where the change touches a
    word (a name is replaced whole: `nmae` -> `name`, not `ma` -> `am`)."""

    def word(c: str) -> bool:
        return bool(_WORD.match(c))

    while lo > 0 and word(text[lo - 1]) and ((lo < hi and word(text[lo])) or (new and word(new[0]))):
        lo -= 1
        new = text[lo] + new
    while hi < len(text) and word(text[hi]) and ((lo < hi and word(text[hi - 1])) or (new and word(new[-1]))):
        new = new + text[hi]
        hi += 1
    return lo, hi, new


def implied(text: str, start: int, old: str, new: str, scope: tuple[int, int] | None = None) -> list[Replacement]:
    """What an edit implies elsewhere: the edit replaced `old` with `new` at `start` (an
    offset in `text`, the document after it). Grown to whole words, the old text is looked
    for elsewhere as whole words, within `scope` (the function the edit is in, where a
    renamed local lives: engine.spans.enclosing_scope; None: everywhere), not as an
    attribute (`x.old` is another object's); each place where it still stands is proposed
    the same change (a rename's other uses, a line like the one changed), the nearest
    first, at most MAX_PROPOSALS. Nothing for a change with no word in its old text."""
    before = text[:start] + old + text[start + len(new) :]
    lo, hi, grown_new = grown(before, start, start + len(old), new)
    was = before[lo:hi]
    if not _WORD.search(was) or was == grown_new or len(was.strip()) < 2:
        return []
    edited = (lo, lo + len(grown_new))  # the edit in `text`
    pattern = re.compile(rf"(?<![\w$.]){re.escape(was)}(?![\w$])")
    lo_scope, hi_scope = scope if scope is not None else (0, len(text))
    places = [
        m.start() for m in pattern.finditer(text, lo_scope, hi_scope) if m.end() <= edited[0] or m.start() >= edited[1]
    ]
    places.sort(key=lambda p: abs(p - lo))
    return [Replacement(p, p + len(was), grown_new) for p in places[:MAX_PROPOSALS]]
