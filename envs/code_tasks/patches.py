"""Unified diffs: make one, apply one, and turn one into the env's `edit` commands.

Files are `{relative path: text}` dicts; line numbers are 1-based like in the env.
"""

from __future__ import annotations

import dataclasses
import difflib
import re

_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclasses.dataclass
class Hunk:
    old_start: int  # 1-based first old line (for an insertion: the line it comes after)
    old_lines: list[str]  # the old side, context included
    new_lines: list[str]  # the new side, context included


@dataclasses.dataclass
class FilePatch:
    old_path: str | None  # None for a new file
    new_path: str | None  # None for a deleted file
    hunks: list[Hunk]


def make_patch(old: dict[str, str], new: dict[str, str], context: int = 3) -> str:
    """A git-style unified diff from `old` to `new` (files present in either)."""
    chunks = []
    for path in sorted(set(old) | set(new)):
        a, b = old.get(path), new.get(path)
        if a == b:
            continue
        diff = difflib.unified_diff(
            (a or "").splitlines(keepends=True), (b or "").splitlines(keepends=True),
            fromfile=f"a/{path}" if a is not None else "/dev/null",
            tofile=f"b/{path}" if b is not None else "/dev/null", n=context,
        )
        chunks.append(f"diff --git a/{path} b/{path}\n" + "".join(
            line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
            for line in diff))
    return "".join(chunks)


def _strip_prefix(name: str) -> str | None:
    name = name.split("\t")[0].strip()
    if name == "/dev/null":
        return None
    return name[2:] if name[:2] in ("a/", "b/") else name


def parse_patch(text: str) -> list[FilePatch]:
    """Parses a unified diff (git or plain); raises ValueError on a malformed hunk."""
    patches: list[FilePatch] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            current = FilePatch(_strip_prefix(lines[i][4:]), _strip_prefix(lines[i + 1][4:]), [])
            patches.append(current)
            i += 2
            while i < len(lines) and (match := _HUNK_RE.match(lines[i])):
                i = _read_hunk(lines, i + 1, match, current)
            continue
        i += 1
    return patches


def _read_hunk(lines: list[str], i: int, match: re.Match, into: FilePatch) -> int:
    old_count = int(match.group(2) or 1)
    new_count = int(match.group(4) or 1)
    hunk = Hunk(int(match.group(1)), [], [])
    while len(hunk.old_lines) < old_count or len(hunk.new_lines) < new_count:
        if i >= len(lines):
            raise ValueError(f"patch hunk for {into.new_path or into.old_path} is truncated")
        line = lines[i]
        tag, body = (line[:1], line[1:]) if line else (" ", "")
        if tag == "\\":
            i += 1
            continue
        if tag not in " -+":
            raise ValueError(f"bad patch line {line!r}")
        if tag in " -":
            hunk.old_lines.append(body)
        if tag in " +":
            hunk.new_lines.append(body)
        i += 1
    while i < len(lines) and lines[i].startswith("\\"):
        i += 1
    into.hunks.append(hunk)
    return i


def _first_line(hunk: Hunk) -> int:
    """0-based index of the hunk's first old line (insertions sit after old_start)."""
    return hunk.old_start if not hunk.old_lines else hunk.old_start - 1


def apply_patch(files: dict[str, str], patch: str) -> dict[str, str]:
    """A new files dict with `patch` applied; ValueError when a hunk does not match."""
    out = dict(files)
    for fp in parse_patch(patch):
        if fp.new_path is None:
            out.pop(fp.old_path, None)
            continue
        old_text = out.get(fp.old_path, "") if fp.old_path else ""
        lines = old_text.splitlines()
        for hunk in sorted(fp.hunks, key=lambda h: h.old_start, reverse=True):
            start = _first_line(hunk)
            if lines[start:start + len(hunk.old_lines)] != hunk.old_lines:
                raise ValueError(f"patch does not apply to {fp.old_path} near line {start + 1}")
            lines[start:start + len(hunk.old_lines)] = hunk.new_lines
        if fp.old_path and fp.old_path != fp.new_path:
            out.pop(fp.old_path, None)
        out[fp.new_path] = "\n".join(lines) + ("\n" if lines else "")
    return out


def patch_to_actions(patch: str) -> list[str]:
    """The env's `edit FILE START-END` commands that apply `patch` to existing files.

    Each hunk replaces its old side (context included) by its new side; the hunks of a
    file run bottom-up so the line numbers of the earlier ones stay valid. New or
    deleted files cannot be expressed as edits: ValueError.
    """
    actions = []
    for fp in parse_patch(patch):
        if fp.old_path is None or fp.new_path is None or fp.old_path != fp.new_path:
            raise ValueError(f"patch creates, deletes or renames a file ({fp.old_path} -> "
                             f"{fp.new_path}); the env can only edit existing files")
        for hunk in sorted(fp.hunks, key=lambda h: h.old_start, reverse=True):
            start = _first_line(hunk) + 1
            end = start + len(hunk.old_lines) - 1  # end == start - 1: a pure insertion
            body = "".join("\n" + line for line in hunk.new_lines)
            actions.append(f"edit {fp.new_path} {start}-{end}{body}")
    return actions
