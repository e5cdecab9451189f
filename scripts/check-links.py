#!/usr/bin/env python3
"""Check the relative links and #anchors of the guide (docs/book/src) and the repository's front pages.

Usage: scripts/check-links.py [REPO_ROOT]

Every markdown link `[text](target)` outside code is checked, except those with a scheme (https:, mailto:):
- the target file or folder exists (relative to the page);
- a `#anchor` names a heading of the target page (mdBook's ids: lower case, punctuation dropped,
  spaces to dashes, `-1`, `-2` for repeats), or of the page itself for a bare `#anchor`;
- a link in the book stays inside docs/book/src, since the rendered book holds nothing else;
- every page of docs/book/src is listed in SUMMARY.md, every page SUMMARY.md lists exists, and every
  `{{#include FILE}}` names a file.

Why not mdbook-linkcheck: its last release (0.7.7) is built against mdBook 0.4's renderer interface (the
book builds with 0.5) and would add an HTTP client with OpenSSL to CI's install; this file checks the
same relative links and anchors in well under a second, with nothing to install.
"""

import re
import sys
from pathlib import Path

ROOT = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent).resolve()
BOOK = ROOT / "docs" / "book" / "src"
FRONT = ["README.md", "ARCHITECTURE.md", "docs/scheduling.md"]

LINK = re.compile(r"(?<!\!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
IMAGE = re.compile(r"\!\[[^\]]*\]\(\s*<?([^)\s>]+)>?\s*\)")
INCLUDE = re.compile(r"\{\{#include\s+([^}\s:]+)(?::[^}]*)?\s*\}\}")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def prose_lines(text):
    """(line number, line) outside fenced code blocks, with inline code spans blanked."""
    fence = None
    for n, line in enumerate(text.split("\n"), 1):
        stripped = line.lstrip()
        m = re.match(r"(`{3,}|~{3,})", stripped)
        if m:
            if fence is None:
                fence = m.group(1)[0] * len(m.group(1))
            elif stripped.startswith(fence):
                fence = None
            continue
        if fence is not None or line.startswith("    ") and not stripped.startswith(("-", "*", "|")):
            continue
        yield n, re.sub(r"(`+)(.+?)\1", lambda c: " " * len(c.group(0)), line)


def slug(title):
    """mdBook's heading id: the text without markup, lower case, only alphanumerics, `-` and `_` kept."""
    text = re.sub(r"<[^>]*>", "", title)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    out = []
    for ch in text.strip().lower():
        if ch.isalnum() or ch in "-_":
            out.append(ch)
        elif ch.isspace():
            out.append("-")
    return "".join(out)


_anchor_cache = {}


def anchors(path):
    if path not in _anchor_cache:
        seen, ids = {}, set()
        text = path.read_text(encoding="utf-8")
        fence = None
        for line in text.split("\n"):
            stripped = line.lstrip()
            m = re.match(r"(`{3,}|~{3,})", stripped)
            if m:
                fence = None if fence else m.group(1)
                continue
            if fence:
                continue
            h = HEADING.match(line)
            if h:
                base = slug(h.group(2))
                n = seen.get(base, 0)
                seen[base] = n + 1
                ids.add(base if n == 0 else f"{base}-{n}")
        ids |= set(re.findall(r'id="([^"]+)"', text))
        _anchor_cache[path] = ids
    return _anchor_cache[path]


def check_page(page, problems):
    text = page.read_text(encoding="utf-8")
    in_book = BOOK in page.parents
    rel = page.relative_to(ROOT)
    for n, line in prose_lines(text):
        targets = [m.group(1) for m in LINK.finditer(line)] + [m.group(1) for m in IMAGE.finditer(line)]
        for target in targets:
            if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
                continue  # https:, mailto:: not checked offline
            where = f"{rel}:{n}: link `{target}`"
            file_part, _, anchor = target.partition("#")
            dest = (page.parent / file_part).resolve() if file_part else page
            if not dest.exists():
                problems.append(f"{where}: {dest.relative_to(ROOT) if ROOT in dest.parents else dest} "
                                "does not exist; fix the path (it is relative to this page)")
                continue
            if in_book and BOOK not in dest.parents and dest != BOOK:
                problems.append(f"{where}: leaves docs/book/src, so the rendered book has no such page; "
                                "link a page of the book, or name the repository file in `code`")
                continue
            if anchor:
                if dest.is_dir() or dest.suffix != ".md":
                    problems.append(f"{where}: #{anchor} on a file that is not a markdown page")
                elif anchor not in anchors(dest):
                    known = ", ".join(sorted(anchors(dest))[:12])
                    problems.append(f"{where}: no heading with id #{anchor} in {dest.relative_to(ROOT)} "
                                    f"(ids there: {known})")
    for m in INCLUDE.finditer(text):
        if not (page.parent / m.group(1)).exists():
            problems.append(f"{rel}: {{{{#include {m.group(1)}}}}}: no such file")


def check_summary(problems):
    summary = BOOK / "SUMMARY.md"
    listed = set()
    for n, line in prose_lines(summary.read_text(encoding="utf-8")):
        for m in LINK.finditer(line):
            listed.add((BOOK / m.group(1).partition("#")[0]).resolve())
    for page in sorted(BOOK.rglob("*.md")):
        if page.name != "SUMMARY.md" and page.resolve() not in listed:
            problems.append(f"{page.relative_to(ROOT)}: not listed in docs/book/src/SUMMARY.md, so the book "
                            "never shows it; add it there (or remove the file)")


def main():
    problems = []
    pages = sorted(BOOK.rglob("*.md")) + [ROOT / p for p in FRONT if (ROOT / p).exists()]
    for page in pages:
        check_page(page, problems)
    check_summary(problems)
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print(f"check-links: {len(problems)} broken link(s) in {len(pages)} pages", file=sys.stderr)
        return 1
    print(f"check-links: {len(pages)} pages, every relative link and anchor resolves")
    return 0


if __name__ == "__main__":
    sys.exit(main())
