"""Which pages of a process's heap a fork copied, and which Python objects start on them.

Shared by the copy-on-write probes (cow/dirty.py, real_django/dirty.py): the physical frame
behind every present page of the private writable mappings (/proc/self/pagemap; needs root), and
a walk of the heap that names the objects starting on each page.
"""

from __future__ import annotations

import gc
import os
import struct
import sys
from collections import Counter, defaultdict

PAGE = os.sysconf("SC_PAGE_SIZE")


def writable_private_mappings() -> list[tuple[int, int, str]]:
    maps = []
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if fields[1].startswith("rw") and fields[1][3] == "p":
                start, end = (int(x, 16) for x in fields[0].split("-"))
                name = fields[5].strip() if len(fields) > 5 else ""
                maps.append((start, end, name or "[anon]"))
    return maps


def present_pages(maps: list[tuple[int, int, str]]) -> dict[int, int]:
    """Virtual page address -> physical frame number, for the present pages of maps."""
    frames = {}
    with open("/proc/self/pagemap", "rb") as f:
        for start, end, _ in maps:
            f.seek(start // PAGE * 8)
            data = f.read((end - start) // PAGE * 8)
            for i, (entry,) in enumerate(struct.iter_unpack("<Q", data)):
                if entry >> 63 & 1:
                    frames[start + i * PAGE] = entry & ((1 << 55) - 1)
    return frames


def exclusive_pages(maps: list[tuple[int, int, str]]) -> set[int]:
    """The present pages of maps that only this process maps (its USS there: bit 56 of pagemap)."""
    pages = set()
    with open("/proc/self/pagemap", "rb") as f:
        for start, end, _ in maps:
            f.seek(start // PAGE * 8)
            data = f.read((end - start) // PAGE * 8)
            for i, (entry,) in enumerate(struct.iter_unpack("<Q", data)):
                if entry >> 63 & 1 and entry >> 56 & 1:
                    pages.add(start + i * PAGE)
    return pages


def heap_objects() -> tuple[dict[int, list[str]], Counter[str]]:
    """Start page of every object reachable from the GC's lists and sys.modules -> their kinds;
    and the number of pages on which objects of each kind start."""
    gc.unfreeze()
    seen: set[int] = set()
    kinds: dict[int, list[str]] = defaultdict(list)
    stack = list(gc.get_objects()) + list(sys.modules.values())
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        kind = type(obj).__name__
        if (kind == "code" and obj.co_name == "__annotate__") or (
                kind == "function" and obj.__name__ == "__annotate__"):
            kind += " (__annotate__)"  # 3.14+: each annotated def's lazy annotations
        kinds[id(obj) // PAGE * PAGE].append(kind)
        refs = gc.get_referents(obj)
        if kind == "code":
            refs += [obj.co_consts, obj.co_names, obj.co_varnames, obj.co_filename, obj.co_name,
                     obj.co_linetable, obj.co_exceptiontable, obj.co_qualname]
        elif isinstance(obj, dict):
            refs += list(obj.keys())
        stack.extend(refs)
    pages: Counter[str] = Counter()
    for starting in kinds.values():
        pages.update(set(starting))
    return kinds, pages


def copied_report(copied: set[int], maps: list[tuple[int, int, str]], top: int,
                  mappings: int | None = None, what: str = "copied") -> list[str]:
    """Lines for the pages a child copied (or owns: `what`): MiB per mapping (the `mappings`
    largest), then per kind of object starting on them (a page split evenly among its objects; the
    `top` kinds)."""
    by_map: Counter[str] = Counter()
    for page in copied:
        for lo, hi, name in maps:
            if lo <= page < hi:
                by_map[name.rsplit("/", 1)[-1]] += PAGE
                break
    lines = ["", f"mapping                                   {what:>6} MiB"]
    lines += [f"{name[:40]:<40} {size / 2**20:10.1f}" for name, size in by_map.most_common(mappings)]
    kinds, pages = heap_objects()
    by_kind: Counter[str] = Counter()
    for page in copied:
        starting = kinds.get(page)
        if not starting:
            by_kind["(no object starts here)"] += PAGE
            continue
        for kind in starting:
            by_kind[kind] += PAGE / len(starting)
    copied_pages: Counter[str] = Counter()
    for page in copied:
        copied_pages.update(set(kinds.get(page, ())))
    lines += ["", f"objects starting on {what} pages   {what} MiB (page shared evenly)"
              f"   pages {what} / with one"]
    lines += [f"{kind[:40]:<40} {size / 2**20:10.1f}  {copied_pages[kind]:>9,} / {pages[kind]:,}"
              for kind, size in by_kind.most_common(top)]
    return lines
