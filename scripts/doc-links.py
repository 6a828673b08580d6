#!/usr/bin/env python3
"""Every link between the repository's documents, and every cited section,
points at something that exists.

Checked:
  1. In every *.md file (outside target/ and other build or run folders),
     every relative markdown link `[text](path)`, `[text](path#anchor)` and
     `[text](#anchor)` names an existing file, and an anchor names a heading
     of that file by GitHub's slug rules (lowercase; punctuation other than
     `-` and `_` dropped; spaces become `-`; a repeated heading gets -1, -2).
     Links inside code (fenced blocks, `inline code`) are not links.
  2. In the docs, the source and its comments (*.md, *.rs, *.toml, *.sh,
     *.py, .ci/*), every mention of a `docs/...md` file names a file that
     exists, and a cited section names a heading of that file:
         docs/NAME.md, "Section title"
         docs/NAME.md ("Section title")
         docs/NAME.md "Section title"
         `docs/NAME.md`, section "Section title"
         README "Section title"   (also README's, README.md)
     A citation may run on to the next line of a comment: comment leaders
     (//!, ///, //, #) are dropped and the lines joined before matching.

Prints each broken one as file:line and exits 1; prints a count and exits 0
when there are none. Standard library only:

    python3 scripts/doc-links.py
"""

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP_DIRS = {".git", "target", "runs", ".gpu", "__pycache__", "node_modules"}
SOURCE_EXTS = (".md", ".rs", ".toml", ".sh", ".py")
SELF = os.path.relpath(os.path.abspath(__file__), ROOT)  # its examples are not citations

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^ {0,3}(```|~~~)")
DOC_PATH = r"(docs/[A-Za-z0-9_./-]+\.md|README(?:\.md)?)"
CITATION = re.compile(DOC_PATH + r"`?(?:'s)?(?:,\s*|\s*\(\s*|\s+)(?:section\s+)?\"([^\"]+)\"")
MENTION = re.compile(r"(?<![A-Za-z0-9_/.-])(docs/[A-Za-z0-9_./-]*[A-Za-z0-9_-]\.md)\b")
COMMENT_LEADER = re.compile(r"^\s*(//[/!]?|#(?![#!\[]))\s?")


def repo_files():
    """Paths (relative to the root) of the files this check reads."""
    for top, dirs, files in os.walk(ROOT):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        for name in sorted(files):
            rel = os.path.relpath(os.path.join(top, name), ROOT)
            if rel != SELF and (name.endswith(SOURCE_EXTS) or rel.startswith(".ci" + os.sep)):
                yield rel


def slug(text):
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link: its words
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def prose_lines(text):
    """(line number, line) outside fenced code blocks, inline code blanked."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if match:
            if fence is None:
                fence = match.group(1)
            elif fence == match.group(1):
                fence = None
            continue
        if fence is None:
            yield number, re.sub(r"`[^`]*`", "``", line)


_anchors = {}


def anchors(path):
    """The heading anchors of a markdown file (cached)."""
    if path not in _anchors:
        seen, found = {}, set()
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            for _, line in prose_lines(f.read()):
                match = HEADING.match(line)
                if match:
                    base = slug(match.group(2))
                    count = seen.get(base, 0)
                    seen[base] = count + 1
                    found.add(base if count == 0 else f"{base}-{count}")
        _anchors[path] = found
    return _anchors[path]


def check_links(path, text, broken):
    """Rule 1: the relative links of one markdown file."""
    here = os.path.dirname(path)
    for number, line in prose_lines(text):
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, mailto:, …
                continue
            file_part, _, anchor = target.partition("#")
            linked = os.path.normpath(os.path.join(here, file_part)) if file_part else path
            where = f"{path}:{number}: [{target}]"
            if not os.path.exists(os.path.join(ROOT, linked)):
                broken.append(f"{where}: no file {linked}")
            elif anchor and linked.endswith(".md") and anchor not in anchors(linked):
                broken.append(f"{where}: {linked} has no heading #{anchor}")


def check_citations(path, text, broken):
    """Rule 2: files and sections cited by path, in prose and comments."""
    lines = [COMMENT_LEADER.sub("", line, count=1) for line in text.splitlines()]
    for index, line in enumerate(lines):
        number = index + 1
        for cited in sorted(set(MENTION.findall(line))):
            if not os.path.exists(os.path.join(ROOT, cited)):
                broken.append(f"{path}:{number}: {cited}: no such file")
        # A citation that starts on this line, perhaps ending on the next.
        joined = line + " " + (lines[index + 1].strip() if index + 1 < len(lines) else "")
        for match in CITATION.finditer(joined):
            if match.start() >= len(line):
                continue
            cited, section = match.group(1), " ".join(match.group(2).split())
            if cited.startswith("README"):
                cited = "README.md"
            if not os.path.exists(os.path.join(ROOT, cited)):
                continue  # already reported as a missing file, where it is a path
            if slug(section) not in anchors(cited):
                broken.append(f'{path}:{number}: {cited}, "{section}": no such heading')


def main():
    broken, files = [], 0
    for path in repo_files():
        try:
            with open(os.path.join(ROOT, path), encoding="utf-8") as f:
                text = f.read()
        except (UnicodeDecodeError, OSError):
            continue
        files += 1
        if path.endswith(".md"):
            check_links(path, text, broken)
        check_citations(path, text, broken)
    for line in broken:
        print(line)
    if broken:
        print(f"{len(broken)} broken link(s) or citation(s)", file=sys.stderr)
        return 1
    print(f"doc-links: {files} files, every link and cited section exists")
    return 0


if __name__ == "__main__":
    sys.exit(main())
