"""Memoises the template parses TextWorld's PDDL engine repeats on every step.

`PddlEnv` re-derives the text of every admissible command after each step, and each
derivation first parses its template string with a TatSu parser (`textgen._parse_and_convert`),
as do the grammar's conditional queries (`logic._parse_and_convert`). The templates come from
the grammar, so there are few of them: the parse results are cached and a deep copy handed out
each time (callers mutate what they get), which leaves the produced text byte-identical.
"""

from __future__ import annotations

import copy
import functools

_ORIGINALS: dict = {}
MAX_TEMPLATES = 8192


def _memoised(parse):
    @functools.lru_cache(maxsize=MAX_TEMPLATES)
    def cached(args, kwargs):
        return parse(*args, **dict(kwargs))

    @functools.wraps(parse)
    def wrapper(*args, **kwargs):
        try:
            key = (args, tuple(sorted(kwargs.items())))
            hash(key)
        except TypeError:
            return parse(*args, **kwargs)
        return copy.deepcopy(cached(*key))

    return wrapper


def set_enabled(enabled: bool) -> None:
    """Installs (True) or removes (False) the memoised parsers; idempotent."""
    from textworld import logic
    from textworld.envs.pddl import textgen

    for module in (textgen, logic):
        if enabled and module not in _ORIGINALS:
            _ORIGINALS[module] = module._parse_and_convert
            module._parse_and_convert = _memoised(module._parse_and_convert)
        elif not enabled and module in _ORIGINALS:
            module._parse_and_convert = _ORIGINALS.pop(module)


def is_enabled() -> bool:
    return bool(_ORIGINALS)
