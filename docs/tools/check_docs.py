#!/usr/bin/env python3
"""Checks the documentation: the docs stage of ./run.sh ci.

    python3 docs/tools/check_docs.py          every check; exit status 1 on any failure
    python3 docs/tools/check_docs.py --fix    rewrite what is derived (snippets, compiler
                                              output, generated tables), then check; a
                                              snippet whose lines moved in their file gets
                                              its range updated rather than other lines

Checks, in order:
  size       README.md is at most 12 KiB.
  links      every relative link and anchor in README.md, docs/ and the examples' READMEs
             resolves (a file or folder of the repository; an anchor: a heading of the
             target page, slugged as GitHub does, or an explicit <a id="...">).
  code       every C++ block in README.md, docs/ and the examples' READMEs says where it
             comes from, on the line before its fence:
                 <!-- snippet: examples/quickstart/quickstart.cpp -->         the whole file
                 <!-- snippet: examples/quickstart/quickstart.cpp#L14-L20 --> lines 14-20
                 <!-- fragment -->                                           not compiled
             A snippet must equal the file's lines byte for byte (a line range loses its
             common indentation). A text block after
                 <!-- compiler-output: examples/quickstart/mistake.cpp -->
             must equal what g++ prints for that file (LC_ALL=C, -fsyntax-only), which
             must fail to compile.
  tables     every region between <!-- generated: NAME --> and <!-- end generated --> equals
             what docs/tools/perf_tables.py makes of the CSVs in bench/results/.
  reference  Doxygen (docs/Doxyfile) builds the API reference with no warning other than
             those listed in docs/reference/known-warnings.txt (Doxygen's parser limits),
             and every listed warning still occurs.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import perf_tables  # noqa: E402  (docs/tools/perf_tables.py)

README_LIMIT = 12 * 1024
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)\s*$")
MARKER = re.compile(r"^\s*<!--\s*(snippet|fragment|compiler-output)\s*:?\s*(.*?)\s*-->\s*$")
GENERATED = re.compile(r"^<!--\s*generated:\s*([\w.-]+)\s*-->\s*$")
END_GENERATED = re.compile(r"^<!--\s*end generated\s*-->\s*$")
CPP_LANGS = {"cpp", "c++", "cxx", "cc", "hpp"}
COMPILE = ["g++", "-std=c++20", "-fsyntax-only", "-fdiagnostics-color=never", "-Iinclude"]


def guide_pages() -> list[Path]:
    """README.md and every page under docs/: the guide."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def linked_pages() -> list[Path]:
    """The pages whose links and code blocks are checked: the guide and the examples' READMEs."""
    return guide_pages() + sorted((ROOT / "examples").glob("*/README.md"))


def rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


# ---- markdown structure -----------------------------------------------------------------


def blocks(lines: list[str]):
    """Yields (fence line index, closing line index, language) of every fenced block."""
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m:
            fence = m.group(2)
            j = i + 1
            while j < len(lines) and not re.match(r"^\s*" + re.escape(fence) + r"\s*$", lines[j]):
                j += 1
            yield i, j, m.group(3).lower()
            i = j + 1
        else:
            i += 1


def outside_code(lines: list[str]) -> list[tuple[int, str]]:
    """The lines of a page that are not inside fenced blocks, with their indices."""
    inside = set()
    for start, end, _ in blocks(lines):
        inside.update(range(start, end + 1))
    return [(i, l) for i, l in enumerate(lines) if i not in inside]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text, lower case, punctuation dropped
    (letters, digits, '_' and '-' kept), spaces as '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links and images: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").replace("*", "")
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    lines = page.read_text(encoding="utf-8").split("\n")
    seen: dict[str, int] = {}
    out = set()
    for _, line in outside_code(lines):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            s = slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
        for a in re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", line):
            out.add(a)
    return out


# ---- checks -----------------------------------------------------------------------------


def check_size(errors: list[str]) -> None:
    size = (ROOT / "README.md").stat().st_size
    if size > README_LIMIT:
        errors.append(f"README.md: {size} bytes, above its limit of {README_LIMIT} (12 KiB); "
                      "move detail into docs/")


LINK = re.compile(r"(!?)\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def check_links(errors: list[str]) -> None:
    cache: dict[Path, set[str]] = {}
    for page in linked_pages():
        lines = page.read_text(encoding="utf-8").split("\n")
        for i, line in outside_code(lines):
            stripped = re.sub(r"`[^`]*`", "", line)  # inline code is not a link
            targets = [m.group(3) for m in LINK.finditer(stripped)]
            targets += re.findall(r"<img[^>]*\ssrc=\"([^\"]+)\"", stripped)
            for target in targets:
                where = f"{rel(page)}:{i + 1}"
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                    continue
                path_part, _, anchor = target.partition("#")
                if path_part == "":
                    dest = page
                elif path_part.startswith("/"):  # from the repository's root, as GitHub reads it
                    dest = (ROOT / path_part.lstrip("/")).resolve()
                else:
                    dest = (page.parent / path_part).resolve()
                try:
                    dest.relative_to(ROOT)
                except ValueError:
                    errors.append(f"{where}: link '{target}' leaves the repository")
                    continue
                if not dest.exists():
                    errors.append(f"{where}: link '{target}': {path_part} does not exist")
                    continue
                if anchor:
                    if dest.is_dir() or dest.suffix != ".md":
                        errors.append(f"{where}: link '{target}': an anchor into a file that "
                                      "is not a Markdown page")
                        continue
                    if dest not in cache:
                        cache[dest] = anchors(dest)
                    if anchor not in cache[dest]:
                        errors.append(f"{where}: link '{target}': {rel(dest)} has no heading "
                                      f"or anchor '#{anchor}'")


def snippet_text(spec: str) -> tuple[str | None, str]:
    """The text a snippet marker names, or None and why not."""
    m = re.fullmatch(r"([^#\s]+)(?:#L(\d+)-L(\d+))?", spec)
    if not m:
        return None, f"snippet marker '{spec}' is neither PATH nor PATH#Lm-Ln"
    path = ROOT / m.group(1)
    if not path.is_file():
        return None, f"snippet source {m.group(1)} does not exist"
    lines = path.read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if m.group(2) is None:
        return "\n".join(lines), ""
    first, last = int(m.group(2)), int(m.group(3))
    if not 1 <= first <= last <= len(lines):
        return None, f"snippet lines L{first}-L{last} lie outside {m.group(1)} ({len(lines)} lines)"
    part = lines[first - 1:last]
    indent = min((len(l) - len(l.lstrip(" ")) for l in part if l.strip()), default=0)
    return "\n".join(l[indent:] for l in part), ""


def relocate(spec: str, have: str) -> str | None:
    """Where the lines of a block now are in its snippet's file, as PATH#Lm-Ln, when its
    stated range has moved (lines added or removed above it); None when they are not there
    once, exactly."""
    m = re.fullmatch(r"([^#\s]+)#L\d+-L\d+", spec)
    if not m or not (ROOT / m.group(1)).is_file():
        return None
    lines = (ROOT / m.group(1)).read_text(encoding="utf-8").split("\n")
    want = have.split("\n")
    found = []
    for first in range(len(lines) - len(want) + 1):
        part = lines[first:first + len(want)]
        indent = min((len(l) - len(l.lstrip(" ")) for l in part if l.strip()), default=0)
        if [l[indent:] for l in part] == want:
            found.append(first)
    if len(found) != 1:
        return None
    return f"{m.group(1)}#L{found[0] + 1}-L{found[0] + len(want)}"


def compiler_output(path: str) -> tuple[str | None, str]:
    if not (ROOT / path).is_file():
        return None, f"compiler-output source {path} does not exist"
    env = dict(os.environ, LC_ALL="C", LANG="C")
    r = subprocess.run(COMPILE + [path], cwd=ROOT, env=env, capture_output=True, text=True)
    if r.returncode == 0:
        return None, f"{path} compiles, but its compiler output is shown as an error"
    return (r.stdout + r.stderr).rstrip("\n"), ""


def check_code(errors: list[str], fix: bool) -> None:
    for page in linked_pages():
        text = page.read_text(encoding="utf-8")
        lines = text.split("\n")
        changed = False
        for start, end, lang in reversed(list(blocks(lines))):
            where = f"{rel(page)}:{start + 1}"
            marker = MARKER.match(lines[start - 1]) if start > 0 else None
            kind, arg = (marker.group(1), marker.group(2)) if marker else (None, "")
            if kind is None:
                if lang in CPP_LANGS:
                    errors.append(f"{where}: a C++ block without a marker on the line before "
                                  "(<!-- snippet: PATH[#Lm-Ln] --> or <!-- fragment -->)")
                continue
            if kind == "fragment":
                continue
            if kind == "snippet":
                want, why = snippet_text(arg)
            else:
                want, why = compiler_output(arg)
            if want is None:
                errors.append(f"{where}: {why}")
                continue
            have = "\n".join(lines[start + 1:end])
            if have != want:
                moved = relocate(arg, have) if fix and kind == "snippet" else None
                if moved:
                    lines[start - 1] = f"<!-- snippet: {moved} -->"
                    changed = True
                elif fix:
                    lines[start + 1:end] = want.split("\n")
                    changed = True
                else:
                    errors.append(f"{where}: the block differs from {kind} {arg} (run "
                                  "docs/tools/check_docs.py --fix to copy it again)")
        if changed:
            page.write_text("\n".join(lines), encoding="utf-8")
            print(f"  rewrote code blocks in {rel(page)}")


def check_tables(errors: list[str], fix: bool) -> None:
    for page in linked_pages():
        lines = page.read_text(encoding="utf-8").split("\n")
        out: list[str] = []
        changed = False
        i = 0
        while i < len(lines):
            m = GENERATED.match(lines[i])
            if not m:
                out.append(lines[i])
                i += 1
                continue
            j = i + 1
            while j < len(lines) and not END_GENERATED.match(lines[j]):
                j += 1
            where = f"{rel(page)}:{i + 1}"
            if j == len(lines):
                errors.append(f"{where}: <!-- generated: {m.group(1)} --> without "
                              "<!-- end generated -->")
                return
            try:
                want = perf_tables.render(m.group(1), page).rstrip("\n").split("\n")
            except perf_tables.TableError as e:
                errors.append(f"{where}: {e}")
                want = lines[i + 1:j]
            if lines[i + 1:j] != want:
                if fix:
                    changed = True
                else:
                    errors.append(f"{where}: table '{m.group(1)}' differs from what "
                                  "docs/tools/perf_tables.py makes of its CSV (run "
                                  "docs/tools/check_docs.py --fix)")
            out += [lines[i], *want, lines[j]]
            i = j + 1
        if changed:
            page.write_text("\n".join(out), encoding="utf-8")
            print(f"  rewrote generated tables in {rel(page)}")


def normalise_warning(line: str) -> str:
    """A warning without the checkout's path and the line number, which move as code
    changes."""
    line = line.replace(str(ROOT) + "/", "")
    return re.sub(r"^([^:]+):\d+:", r"\1:", line.strip())


def check_reference(errors: list[str]) -> None:
    out = ROOT / "build" / "docs"
    out.mkdir(parents=True, exist_ok=True)
    log = out / "warnings.log"
    if log.exists():
        log.unlink()
    r = subprocess.run(["doxygen", "docs/Doxyfile"], cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        errors.append(f"doxygen failed ({r.returncode}): {r.stderr.strip()[:2000]}")
        return
    found = [normalise_warning(l) for l in log.read_text().split("\n") if l.strip()]
    known_file = ROOT / "docs" / "reference" / "known-warnings.txt"
    known = [l.strip() for l in known_file.read_text().split("\n")
             if l.strip() and not l.startswith("#")]
    for w in sorted(set(found) - set(known)):
        errors.append(f"doxygen: {w}")
    for w in sorted(set(known) - set(found)):
        errors.append(f"docs/reference/known-warnings.txt lists a warning Doxygen no longer "
                      f"gives (remove it): {w}")
    if not (out / "html" / "index.html").exists():
        errors.append("doxygen wrote no build/docs/html/index.html")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fix", action="store_true",
                    help="copy snippets, compiler output and generated tables again first")
    ap.add_argument("--no-reference", action="store_true", help="skip the Doxygen build")
    args = ap.parse_args()
    checks = [("size", lambda e: check_size(e)),
              ("links", lambda e: check_links(e)),
              ("code", lambda e: check_code(e, args.fix)),
              ("tables", lambda e: check_tables(e, args.fix))]
    if not args.no_reference:
        checks.append(("reference", check_reference))
    failed = 0
    for name, run in checks:
        t = time.monotonic()
        errors: list[str] = []
        run(errors)
        status = "ok" if not errors else f"{len(errors)} problem(s)"
        print(f"docs: {name:<9} {status} ({time.monotonic() - t:.1f} s)")
        for e in errors:
            print(f"  {e}")
        failed += len(errors)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
