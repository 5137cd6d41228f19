"""The small libraries bugs are planted in, one `Library` per module.

A module's source is a `string.Template`: `$NAME` placeholders are constants drawn per
seed (`consts(rng)`), `${slot_name}` placeholders are bug sites. Every library has one
bug site per task family; a site holds the correct text and the buggy text (both may use
the constants). `cases(rng, c)` draws the calls the test suite makes: (function name,
positional args). Expected values are computed by running the correct module, so tests
are right by construction; whichever cases the buggy module gets wrong become the
FAIL_TO_PASS tests.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class BugSite:
    correct: str
    buggy: str
    hint: str  # one sentence for the problem statement; may use $NAME constants and $mod


@dataclasses.dataclass(frozen=True)
class Library:
    key: str
    module_names: tuple[str, ...]
    source: str
    sites: dict[str, tuple[str, BugSite]]  # task family -> (slot name, site)
    consts: Callable[[random.Random], dict]
    cases: Callable[[random.Random, dict], list[tuple[str, tuple]]]


def _floats(rng: random.Random, n: int, lo: float = -20, hi: float = 20) -> list[float]:
    return [round(rng.uniform(lo, hi), 1) for _ in range(n)]


# ----------------------------------------------------------------------------- stats
STATS_SOURCE = '''"""Small statistics helpers."""


def mean(values):
    """Arithmetic mean of a non-empty sequence; ValueError when it is empty."""
${mean_guard}
    return sum(values) / len(values)


def median(values):
    """Middle of the sorted values (the mean of the two middle ones for an even count)."""
    if not values:
        raise ValueError("median of an empty sequence")
    ordered = sorted(values)
${median_mid}
    if len(ordered) % 2 == 1:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) / 2


def variance(values, ddof=${variance_ddof}):
    """Variance with `ddof` delta degrees of freedom (default $DDOF)."""
    centre = mean(values)
    return sum((v - centre) ** 2 for v in values) / (len(values) - ddof)


def moving_average(values, window=$WINDOW):
    """Means of every run of `window` consecutive values, in order."""
    out = []
${mavg_loop}
        out.append(sum(values[start:start + window]) / window)
    return out


def parse_numbers(text, sep="$SEP"):
    """Floats from text like '1.5${SEP}2${SEP}${SEP}3'; blank items are skipped."""
${parse_items}
'''

STATS = Library(
    key="stats",
    module_names=("stats", "statkit", "numstat"),
    source=STATS_SOURCE,
    sites={
        "missing_edge_case": ("mean_guard", BugSite(
            '    if not values:\n        raise ValueError("mean of an empty sequence")',
            "",
            "`$mod.mean` does not handle an empty sequence: it should raise ValueError.")),
        "wrong_operator": ("median_mid", BugSite(
            "    mid = len(ordered) // 2", "    mid = len(ordered) / 2",
            "`$mod.median` crashes on every input.")),
        "wrong_default": ("variance_ddof", BugSite(
            "$DDOF", "$DDOF_BAD",
            "`$mod.variance` uses the wrong default degrees of freedom (documented: $DDOF).")),
        "off_by_one": ("mavg_loop", BugSite(
            "    for start in range(len(values) - window + 1):",
            "    for start in range(len(values) - window):",
            "`$mod.moving_average` misses a window.")),
        "broken_parsing": ("parse_items", BugSite(
            "    return [float(item) for item in text.split(sep) if item.strip()]",
            "    return [float(item) for item in text.split(sep)]",
            "`$mod.parse_numbers` fails on text with blank items.")),
    },
    consts=lambda rng: (lambda d: {
        "DDOF": d, "DDOF_BAD": 1 - d, "WINDOW": rng.choice([2, 3, 4]),
        "SEP": rng.choice([",", ";", "|"]),
    })(rng.choice([0, 1])),
    cases=lambda rng, c: [
        ("mean", (_floats(rng, rng.randint(3, 6)),)),
        ("mean", ([round(rng.uniform(1, 9), 1)],)),
        ("mean", ([],)),
        ("median", (_floats(rng, 5),)),
        ("median", (_floats(rng, 4),)),
        ("variance", (_floats(rng, 5), 0)),
        ("variance", (_floats(rng, 6),)),
        ("moving_average", (_floats(rng, 6),)),
        ("moving_average", (_floats(rng, 3), 3)),
        ("parse_numbers", (c["SEP"].join(str(x) for x in _floats(rng, 3)),)),
        ("parse_numbers", (f"{rng.randint(1, 9)}{c['SEP']}{c['SEP']}{rng.randint(1, 9)}.5",)),
    ],
)


# --------------------------------------------------------------------------- strings
STRINGS_SOURCE = '''"""Small string helpers."""

import re


def truncate(text, width, suffix="$SUFFIX"):
    """Cuts `text` to at most `width` characters, ending with `suffix` when it was cut."""
    if len(text) <= width:
        return text
${truncate_cut}


def count_words(text):
    """Number of whitespace-separated words (0 for blank text)."""
${count_words}


def pad_left(text, width, fill="${pad_fill}"):
    """Pads `text` on the left with `fill` up to `width` characters."""
    return fill * max(0, width - len(text)) + text


def slugify(text, sep="$SEP"):
    """Lower-case letters and digits of `text`, words joined by `sep`; punctuation dropped."""
${slug_words}
    return sep.join(words)


def is_palindrome(text):
    """True when the letters and digits of `text` read the same both ways (any case)."""
    letters = [ch for ch in text.lower() if ch.isalnum()]
${palindrome_cmp}
'''

_WORDS = ["alpha", "beta", "gamma", "delta", "omega", "kappa", "sigma", "zeta", "theta"]


def _sentence(rng: random.Random, n: int, punct: str = "") -> str:
    return " ".join(rng.choice(_WORDS) + (punct if i % 2 else "") for i in range(n))


STRINGS = Library(
    key="strings",
    module_names=("textutils", "strkit", "wordsmith"),
    source=STRINGS_SOURCE,
    sites={
        "off_by_one": ("truncate_cut", BugSite(
            "    return text[:width - len(suffix)] + suffix",
            "    return text[:width - len(suffix) + 1] + suffix",
            "`$mod.truncate` returns strings longer than `width`.")),
        "missing_edge_case": ("count_words", BugSite(
            "    return len(text.split())", '    return text.count(" ") + 1',
            "`$mod.count_words` miscounts blank text and repeated spaces.")),
        "wrong_default": ("pad_fill", BugSite(
            "$FILL", " ", "`$mod.pad_left` pads with the wrong character by default "
            "(documented: '$FILL').")),
        "broken_parsing": ("slug_words", BugSite(
            '    words = re.findall(r"[a-z0-9]+", text.lower())',
            "    words = text.lower().split()",
            "`$mod.slugify` keeps punctuation.")),
        "wrong_operator": ("palindrome_cmp", BugSite(
            "    return letters == letters[::-1]", "    return letters != letters[::-1]",
            "`$mod.is_palindrome` gives wrong answers.")),
    },
    consts=lambda rng: {
        "SUFFIX": rng.choice(["...", "~", ".."]),
        "FILL": rng.choice([".", "*", "0", "_"]),
        "SEP": rng.choice(["-", "_"]),
    },
    cases=lambda rng, c: [
        ("truncate", (_sentence(rng, 4), rng.randint(8, 14))),
        ("truncate", ("short", 10)),
        ("count_words", (_sentence(rng, rng.randint(2, 5)),)),
        ("count_words", ("",)),
        ("count_words", (_sentence(rng, 2).replace(" ", "   "),)),
        ("pad_left", (rng.choice(_WORDS), 9, "#")),
        ("pad_left", (str(rng.randint(1, 99)), 6)),
        ("slugify", (_sentence(rng, 3).title(),)),
        ("slugify", (_sentence(rng, 4, punct=rng.choice([",", "!", "?"])),)),
        ("is_palindrome", (rng.choice(["Never odd or even", "Step on no pets", "Was it a rat"
                                       " I saw"]),)),
        ("is_palindrome", (rng.choice(_WORDS),)),
    ],
)


# ------------------------------------------------------------------------- intervals
INTERVALS_SOURCE = '''"""Closed integer intervals written like '[3${SEP}7]'."""


def parse_interval(text, sep="$SEP"):
    """(start, end) from '3${SEP}7' or '[3${SEP}7]' (spaces allowed)."""
${parse_split}
    return int(left), int(right)


def length(interval):
    """Number of integers in the closed interval."""
    start, end = interval
${length_expr}


def overlaps(a, b):
    """True when the closed intervals share at least one integer."""
${overlap_expr}


def merge(intervals):
    """Sorted list of the unions of overlapping intervals ([] for no intervals)."""
    ordered = sorted(intervals)
${merge_guard}
    merged = [ordered[0]]
    for start, end in ordered[1:]:
        last_start, last_end = merged[-1]
        if start <= last_end:
            merged[-1] = (last_start, max(last_end, end))
        else:
            merged.append((start, end))
    return merged


def format_interval(interval, sep="${format_sep}"):
    """'[start<sep>end]'; the default separator is '$SEP'."""
    return f"[{interval[0]}{sep}{interval[1]}]"
'''


def _interval(rng: random.Random) -> tuple[int, int]:
    start = rng.randint(0, 30)
    return (start, start + rng.randint(1, 9))


INTERVALS = Library(
    key="intervals",
    module_names=("intervals", "spans", "rangeset"),
    source=INTERVALS_SOURCE,
    sites={
        "broken_parsing": ("parse_split", BugSite(
            '    left, right = text.strip().strip("[]").split(sep)',
            "    left, right = text.split(sep)",
            "`$mod.parse_interval` rejects intervals written with brackets.")),
        "off_by_one": ("length_expr", BugSite(
            "    return end - start + 1", "    return end - start",
            "`$mod.length` is wrong for closed intervals.")),
        "wrong_operator": ("overlap_expr", BugSite(
            "    return a[0] <= b[1] and b[0] <= a[1]", "    return a[0] < b[1] and b[0] < a[1]",
            "`$mod.overlaps` says intervals that share an end point do not overlap.")),
        "missing_edge_case": ("merge_guard", BugSite(
            "    if not ordered:\n        return []", "",
            "`$mod.merge` crashes on an empty list.")),
        "wrong_default": ("format_sep", BugSite(
            "$SEP", "$SEP_BAD", "`$mod.format_interval` uses the wrong default separator.")),
    },
    consts=lambda rng: (lambda seps: {"SEP": seps[0], "SEP_BAD": seps[1]})(
        rng.sample(["..", ":", "~", ";"], 2)),
    cases=lambda rng, c: [
        ("parse_interval", ("{}{}{}".format(*(lambda iv: (iv[0], c["SEP"], iv[1]))(
            _interval(rng))),)),
        ("parse_interval", ("[{} {} {}]".format(*(lambda iv: (iv[0], c["SEP"], iv[1]))(
            _interval(rng))),)),
        ("length", (_interval(rng),)),
        ("length", ((5, 5),)),
        ("overlaps", ((0, 4), (10, 12))),
        ("overlaps", (lambda iv: (iv, (iv[1], iv[1] + 3)))(_interval(rng))),
        ("merge", ([_interval(rng) for _ in range(4)],)),
        ("merge", ([],)),
        ("format_interval", (_interval(rng), "/")),
        ("format_interval", (_interval(rng),)),
    ],
)


# ------------------------------------------------------------------------------ cart
CART_SOURCE = '''"""A tiny shop: order lines, bulk discounts, stock and pages of items."""


def line_total(price, qty, threshold=$THRESHOLD, rate=$RATE):
    """Price of `qty` units; orders of `threshold` units or more get `rate` off."""
    total = price * qty
${bulk_check}
        total *= 1 - rate
    return round(total, 2)


def cart_total(lines, tax_rate=${tax_default}):
    """Sum of the (price, qty) lines plus tax (default rate $TAX), in cents."""
    subtotal = sum(line_total(price, qty) for price, qty in lines)
    return round(subtotal * (1 + tax_rate), 2)


def restock(stock, item, amount):
    """A copy of `stock` with `amount` more units of `item`; amount must be positive."""
${restock_guard}
    new = dict(stock)
    new[item] = new.get(item, 0) + amount
    return new


def page(items, number, size=$PAGE):
    """The items of page `number` (pages count from 1)."""
${page_start}
    return items[start:start + size]


def parse_order_line(text):
    """('apple', 3, 1.25) from an order line like '3 x apple @ 1.25'."""
${order_split}
    name, price = rest.split("@")
    return name.strip(), int(qty), float(price)
'''

_GOODS = ["apple", "pear", "plum", "tea", "soap", "rice"]
_X_GOODS = ["box", "wax", "xylophone", "extra fig"]

CART = Library(
    key="cart",
    module_names=("cart", "shop", "inventory"),
    source=CART_SOURCE,
    sites={
        "wrong_operator": ("bulk_check", BugSite(
            "    if qty >= threshold:", "    if qty > threshold:",
            "`$mod.line_total` does not give the bulk discount at exactly $THRESHOLD units.")),
        "wrong_default": ("tax_default", BugSite(
            "$TAX", "$TAX_BAD", "`$mod.cart_total` applies the wrong default tax rate "
            "(documented: $TAX).")),
        "missing_edge_case": ("restock_guard", BugSite(
            '    if amount <= 0:\n        raise ValueError(f"amount must be positive, got '
            '{amount}")', "",
            "`$mod.restock` accepts zero or negative amounts; it should raise ValueError.")),
        "off_by_one": ("page_start", BugSite(
            "    start = (number - 1) * size", "    start = number * size",
            "`$mod.page` returns the wrong page.")),
        "broken_parsing": ("order_split", BugSite(
            '    qty, rest = text.split(" x ", 1)', '    qty, rest = text.split("x")',
            "`$mod.parse_order_line` fails for items whose name contains an 'x'.")),
    },
    consts=lambda rng: (lambda taxes: {
        "THRESHOLD": rng.choice([3, 5, 10]), "RATE": rng.choice([0.1, 0.15, 0.25]),
        "TAX": taxes[0], "TAX_BAD": taxes[1], "PAGE": rng.choice([2, 3]),
    })(rng.sample([0.05, 0.08, 0.2, 0.21], 2)),
    cases=lambda rng, c: [
        ("line_total", (round(rng.uniform(1, 9), 2), 1)),
        ("line_total", (round(rng.uniform(1, 9), 2), c["THRESHOLD"])),
        ("cart_total", ([(round(rng.uniform(1, 9), 2), rng.randint(1, 2)) for _ in range(3)],
                        0.0)),
        ("cart_total", ([(round(rng.uniform(1, 9), 2), rng.randint(1, 2)) for _ in range(2)],)),
        ("restock", ({"tea": 2}, rng.choice(_GOODS), rng.randint(1, 5))),
        ("restock", ({"tea": 2}, "tea", -rng.randint(0, 3))),
        ("page", (list(range(1, 10)), 1)),
        ("page", (list(range(1, 10)), 2)),
        ("parse_order_line", (f"{rng.randint(1, 9)} x {rng.choice(_GOODS)} @ "
                              f"{round(rng.uniform(1, 9), 2)}",)),
        ("parse_order_line", (f"{rng.randint(1, 9)} x {rng.choice(_X_GOODS)} @ "
                              f"{round(rng.uniform(1, 9), 2)}",)),
    ],
)

LIBRARIES: dict[str, Library] = {lib.key: lib for lib in (STATS, STRINGS, INTERVALS, CART)}
