"""What the python tests share: getting numpy or another module (or skipping), their arguments
and their verdict. Imported from the test's own folder (python puts a script's folder on sys.path).

Exit codes of those tests: 0 pass, 1 fail, 2 usage, 77 skip.
"""
import importlib
import os
import sys


def import_or_skip(name, skip_line, needs=()):
    """Returns the module called name, holding the attributes named in needs. The first python3 on
    PATH may lack it while Debian's has it: then the running script is executed again, once, by
    /usr/bin/python3 (os.execv: this call does not return); where that one lacks it too, prints
    skip_line and exits 77."""
    try:
        module = importlib.import_module(name)
        for attr in needs:
            if not hasattr(module, attr):
                raise ImportError("%s has no %s" % (name, attr))
        return module
    except ImportError:
        if (os.path.exists("/usr/bin/python3") and not os.environ.get("SPILLWAY_PY_REEXEC")
                and os.path.realpath(sys.executable) != os.path.realpath("/usr/bin/python3")):
            os.environ["SPILLWAY_PY_REEXEC"] = "1"
            os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
        print(skip_line)
        sys.exit(77)


def numpy_or_skip():
    """import_or_skip for numpy."""
    return import_or_skip("numpy", "SKIP: numpy not available")


def reference_path():
    """Puts tests/reference/ (the numpy reference modules) first on sys.path."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference"))


def args_ok(argv):
    """True when argv holds <spillway> <models-dir>; else prints the usage line (False: exit 2)."""
    if len(argv) >= 3:
        return True
    print("usage: %s <spillway> <models-dir>" % os.path.basename(argv[0]), file=sys.stderr)
    return False


def verdict(failures, lead=""):
    """Prints the failures (after lead) or PASS; returns the exit code, 1 or 0."""
    if failures:
        print("%s%d FAILURE(S):" % (lead, len(failures)))
        for f in failures:
            print("  " + f)
        return 1
    print("PASS")
    return 0
