#!/usr/bin/env python3
"""Production functions longer than a limit (default 80 lines), outside `#[cfg(test)]` modules
(inline, or in a file of their own beside their parent: `#[cfg(test)] mod tests;`) and test
support (`testing` modules), and whether a one-line reason stands at the top of each
(a `//` comment on the first line of its body).

    python3 hack/long_functions.py [LIMIT] [DIR...]
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIRS = ["shared/src", "bootstrap/src", "etcdcluster/src", "test/sim/src", "test/sim/apiserver/src",
        "test/sim/machines/src"]


def functions(text):
    lines = text.split("\n")
    # Blank out test modules.
    skip = set()
    for i, line in enumerate(lines):
        if line.strip() == "#[cfg(test)]" and i + 1 < len(lines) and re.match(r"\s*(pub(\(.*\))?\s+)?mod\s+\w+\s*\{", lines[i + 1]):
            depth = 0
            for j in range(i + 1, len(lines)):
                depth += lines[j].count("{") - lines[j].count("}")
                skip.add(j)
                if depth == 0 and "{" in "".join(lines[i + 1 : j + 1]):
                    break
    i = 0
    while i < len(lines):
        if i in skip:
            i += 1
            continue
        m = re.match(r"\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?fn\s+(\w+)", lines[i])
        if m:
            name = m.group(5)
            depth = 0
            started = False
            body_start = None
            for j in range(i, len(lines)):
                for ch in lines[j]:
                    if ch == "{":
                        depth += 1
                        if not started:
                            started = True
                            body_start = j
                    elif ch == "}":
                        depth -= 1
                if started and depth == 0:
                    yield name, i + 1, j - i + 1, lines[body_start + 1].strip() if body_start + 1 < len(lines) else ""
                    break
                if not started and lines[j].rstrip().endswith(";"):
                    break
        i += 1


def test_files(dirs):
    """Files holding a module declared `#[cfg(test)] mod name;`: tests beside their file."""
    found = set()
    for d in dirs:
        for root, _, files in os.walk(os.path.join(ROOT, d)):
            for f in files:
                if not f.endswith(".rs"):
                    continue
                path = os.path.join(root, f)
                text = open(path).read()
                base = root if f in ("mod.rs", "lib.rs", "main.rs") else path[:-3]
                for name in re.findall(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", text):
                    found.add(os.path.join(base, name + ".rs"))
                    found.add(os.path.join(base, name, "mod.rs"))
    return found


def main():
    limit = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 80
    dirs = [d for d in sys.argv[1:] if not d.isdigit()] or DIRS
    found = 0
    tests = test_files(dirs)
    for d in dirs:
        for root, _, files in os.walk(os.path.join(ROOT, d)):
            # Test support (the `testing` modules) is not production code.
            if "/testing" in root.replace(os.sep, "/"):
                continue
            for f in sorted(files):
                if not f.endswith(".rs") or f == "testing.rs":
                    continue
                path = os.path.join(root, f)
                if path in tests:
                    continue
                for name, line, length, first in functions(open(path).read()):
                    if length > limit:
                        found += 1
                        reason = "reason: " + first if first.startswith("//") else "NO REASON"
                        print(f"{os.path.relpath(path, ROOT)}:{line} {name} {length} lines; {reason}")
    print(f"{found} functions over {limit} lines")


if __name__ == "__main__":
    main()
