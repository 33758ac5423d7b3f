#!/usr/bin/env python3
"""Internal-linkage functions that two files of one unity batch both define.

The library, the binary and the test executables compile in unity batches (CMake writes
each batch as <target>.dir/Unity/unity_N_<lang>.cxx, a list of #includes). A function in an
anonymous namespace or declared `static` is private to its file only when the file
compiles alone: in a batch, a second file's function of the same name in the same
namespace is either a redefinition (a compile error) or, with other parameter types, an
overload that a call in the first file may pick silently. This check lists every such name
so that it can be renamed or shared through a header.

Usage: unity_names.py BUILD_DIR  (exit 1 and the names when there are any, 0 otherwise;
2 when BUILD_DIR has no unity batch, so that a build without them cannot pass unnoticed).
"""
import collections
import glob
import os
import re
import sys


def strip_comments_and_literals(s):
    s = re.sub(r'R"([^(\s]*)\((.*?)\)\1"', '""', s, flags=re.S)  # raw strings first
    out, i, n = [], 0, len(s)
    while i < n:
        c = s[i]
        if s.startswith("//", i):
            j = s.find("\n", i)
            i = n if j < 0 else j
        elif s.startswith("/*", i):
            j = s.find("*/", i + 2)
            i = n if j < 0 else j + 2
        elif c in "\"'":
            j = i + 1
            while j < n and s[j] != c:
                j += 2 if s[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


FUNC_HEAD = re.compile(r"(~?[A-Za-z_]\w*)\s*\(")
NOT_FUNCS = {"if", "for", "while", "switch", "catch", "return", "sizeof", "decltype",
             "alignas", "static_assert", "noexcept", "operator"}


def internal_functions(path):
    """(namespace path, name) of each function defined at namespace scope with internal
    linkage: inside an anonymous namespace, or `static`."""
    s = strip_comments_and_literals(open(path, encoding="utf-8").read())
    s = re.sub(r"^\s*#.*$", "", s, flags=re.M)  # preprocessor lines
    stack = []  # one entry per open brace: a namespace name ("" = anonymous) or None
    found = set()
    buf = []
    for c in s:
        if c == "{":
            head = "".join(buf)
            m = re.search(r"\bnamespace\s*([\w:]*)\s*$", head)
            at_ns_scope = all(x is not None for x in stack)
            if m:
                stack.append(m.group(1))
            else:
                if at_ns_scope and "(" in head and not re.search(
                        r"\b(struct|class|union|enum)\b", head.split("(")[0]):
                    before = head[:head.index("(") + 1]
                    fm = list(FUNC_HEAD.finditer(before))
                    name = fm[-1].group(1) if fm else None
                    anonymous = "" in stack
                    static = re.search(r"(^|\s)static\s", " " + head) is not None
                    if name and name not in NOT_FUNCS and "::" not in before.split(name)[0][-2:] \
                            and (anonymous or static) and "=" not in before:
                        found.add(("::".join(x for x in stack if x), name))
                stack.append(None)
            buf = []
        elif c == "}":
            if stack:
                stack.pop()
            buf = []
        elif c == ";":
            buf = []
        else:
            buf.append(c)
    return found


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[-3], file=sys.stderr)
        return 2
    batches = [b for b in glob.glob(os.path.join(sys.argv[1], "**", "Unity", "unity_*"),
                                    recursive=True) if re.search(r"\.(cxx|cpp|cu)$", b)]
    if not batches:
        print(f"unity_names: no unity batch under {sys.argv[1]} (built with MCPP_UNITY=ON?)",
              file=sys.stderr)
        return 2
    clashes = 0
    files = 0
    for batch in sorted(batches):
        srcs = re.findall(r'#include\s+"([^"]+)"', open(batch, encoding="utf-8").read())
        owners = collections.defaultdict(list)
        for src in srcs:
            files += 1
            for key in internal_functions(src):
                owners[key].append(src)
        for (ns, name), paths in sorted(owners.items()):
            if len(paths) > 1:
                clashes += 1
                print(f"{batch}: {ns + '::' if ns else ''}{name} is defined with internal "
                      f"linkage in {len(paths)} of its files: {', '.join(paths)}")
    if clashes:
        print(f"HINT: rename one of them, or declare the function once in a header and define "
              f"it in one file", file=sys.stderr)
        return 1
    print(f"unity_names: {len(batches)} batches, {files} files, no shared internal names")
    return 0


if __name__ == "__main__":
    sys.exit(main())
