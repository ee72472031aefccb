"""The unit-test runner that `sandbox.run_python_tests` ships *into* the sandbox (stdlib only).

Not imported by tether: its source is run by the sandbox's `python3 -I -S` (no site-packages,
so no pytest). Protocol: stdin holds two lines, a per-run nonce and the test file's name. The
runner reads the pristine test source *before* any model code runs, so a solution that rewrites
the test file changes nothing (daydream#452), then reports "<nonce> <passed>" on stdout before
the first test and after each one: a time-out still leaves a partial count, and a missing first
report means the runner itself failed (an infrastructure failure, not a 0).

Tests: top-level `test*` functions, and `test*` methods of top-level classes (unittest.TestCase
subclasses run through unittest, other classes are instantiated without arguments); coroutine
tests run under asyncio. The same rule counts them on the host (`compute_test_count`).
"""

import ast
import sys
import traceback


def _tests(tree):
    for node in tree.body:
        members = node.body if isinstance(node, ast.ClassDef) else [node]
        for m in members:
            if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and m.name.startswith("test"):
                yield (node.name if m is not node else None), m.name


def _run_one(ns, cls, name):
    if cls is None:
        out = ns[name]()
    else:
        klass = ns[cls]
        unittest = sys.modules.get("unittest")
        if unittest is not None and isinstance(klass, type) and issubclass(klass, unittest.TestCase):
            res = unittest.TestResult()
            klass(name).run(res)
            if not res.wasSuccessful() or res.skipped or res.testsRun != 1:
                raise AssertionError("".join(t for _, t in res.failures + res.errors) or "skipped")
            return
        out = getattr(klass(), name)()
    if hasattr(out, "__await__"):
        import asyncio

        asyncio.run(out)


def _main():
    nonce = sys.stdin.readline().strip()
    test_file = sys.stdin.readline().strip()
    with open(test_file) as f:
        src = f.read()
    tests = list(_tests(ast.parse(src)))

    def report(n):
        sys.stdout.write("\n%s %d\n" % (nonce, n))  # leading newline: always at a line start
        sys.stdout.flush()

    report(0)
    ns = {"__name__": test_file[:-3], "__file__": test_file}
    try:
        exec(compile(src, test_file, "exec"), ns)  # imports the solution: model code from here on
    except BaseException:
        traceback.print_exc()
        sys.exit(1)
    passed = 0
    for cls, name in tests:
        try:
            _run_one(ns, cls, name)
            passed += 1
        except BaseException:  # SystemExit and KeyboardInterrupt from model code fail one test
            print("FAILED", name if cls is None else cls + "." + name, file=sys.stderr)
            traceback.print_exc()
        report(passed)
    sys.exit(0 if passed == len(tests) else 1)


if __name__ == "__main__":
    _main()
