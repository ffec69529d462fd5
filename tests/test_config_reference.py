#!/usr/bin/env python3
"""The README's configuration reference and the commands' flags against the key table.

Usage (ctest): test_config_reference.py SPILLWAY_BINARY [MODELS_DIR]   (MODELS_DIR is ignored)
       test_config_reference.py SPILLWAY_BINARY --write   (rewrites README.md's generated part)
Exit: 0 pass, 1 fail, 77 skip (no binary given).

The key table (worker/config.c) is the one source of every worker key's default, range and
meaning. Checks:
  * README.md holds, between `<!-- keys:begin` and `<!-- keys:end -->`, exactly what
    `spillway config --markdown` prints: the same keys (none missing, none extra), defaults,
    values and meanings, in the same module sections;
  * `spillway config --keys` lists the same keys with the same defaults;
  * every flag of `spillway generate` (and eval, logits, plan, produce, batch) that sets what a worker key sets names
    that key in its help, with the key's default, values and meaning, and accepts exactly the
    key's range or choices (the bounds pass the parser, one beyond is refused with exit 2);
  * `spillway worker --help` names worker.id and does not offer config's --keys / --check.
"""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
BEGIN = "<!-- keys:begin"
END = "<!-- keys:end -->"

# the flags that set a worker key: command -> {flag: key}; --help must show each
FLAGS = {
    "generate": {
        "--threads": "threads", "--kv-type": "kv.type", "--block-tokens": "kv.block_tokens",
        "--batch-tokens": "batch.max_tokens", "--max-seqs": "batch.max_seqs",
        "--kv-mem-mb": "kv.mem_mb", "--kv-blocks": "kv.blocks", "--ctx": "ctx",
        "--no-prefix-cache": "prefix_cache", "--cache-redis": "cache.redis.host",
        "--cache-arena": "cache.arena.path", "--cache-arena-mb": "cache.arena.mb",
        "--cache-timeout-ms": "cache.redis.timeout_ms", "--cache-secret": "cache.secret_file",
    },
}
for cmd in ("eval", "logits"):
    FLAGS[cmd] = {f: k for f, k in FLAGS["generate"].items() if not f.startswith("--cache")}
FLAGS["plan"] = {f: FLAGS["generate"][f] for f in ("--ctx", "--block-tokens", "--kv-type",
                                                   "--batch-tokens", "--max-seqs")}
FLAGS["generate"]["-n"] = "limits.default_max_tokens"
# the producer routing flags of produce and batch (cli/route.c)
for cmd in ("produce", "batch"):
    FLAGS[cmd] = {"--route": "route.mode", "--key-prefix": "route.prefix_bytes",
                  "--route-eps": "route.eps", "--route-window": "route.window",
                  "--route-vnodes": "route.vnodes"}
# flags whose help words the key's setting in their own terms (default and values still checked)
OWN_WORDS = {"--no-prefix-cache", "-n", "--batch-tokens", "--max-seqs"}

failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL: " + msg)
    return cond


def run(binary, *args):
    return subprocess.run([binary] + list(args), capture_output=True, text=True, timeout=60)


def cells(row):
    """The cells of a Markdown table row, '\\|' unescaped."""
    parts = re.split(r"(?<!\\) \| ", row.strip()[2:-2])
    return [p.replace("\\|", "|") for p in parts]


def parse_markdown(text):
    """{key: (section, default, values, meaning)} and the keys in order."""
    keys, order, section = {}, [], None
    for line in text.split("\n"):
        if line.startswith("#### "):
            section = line[5:].strip()
        elif line.startswith("| `"):
            c = cells(line)
            if not check(len(c) == 4, "markdown row without 4 cells: " + line):
                continue
            name = c[0].strip("`")
            default = "" if c[1] == "(empty)" else c[1][1:-1]
            check(name not in keys, "key %s twice in the markdown" % name)
            keys[name] = (section, default, c[2], c[3])
            order.append(name)
    return keys, order


def readme_part():
    s = open(README, encoding="utf-8").read()
    a, b = s.find(BEGIN), s.find(END)
    if not check(a >= 0 and b > a, "README.md has no %s ... %s markers" % (BEGIN, END)):
        return s, None, None
    a = s.index("\n", a) + 1
    return s, a, b


def help_entries(text):
    """{flag: joined help text} of a --help output: an entry starts with '  -', continuation
    lines are indented further."""
    out, cur = {}, None
    for line in text.split("\n"):
        m = re.match(r"  (--?[\w-]+)", line)
        if m:
            cur = m.group(1)
            out[cur] = line.strip()
        elif cur and line.startswith("    ") and line.strip():
            out[cur] += " " + line.strip()
        else:
            cur = None
    return out


def check_flags(binary, keys):
    for cmd, flags in FLAGS.items():
        r = run(binary, cmd, "--help")
        if not check(r.returncode == 0, "spillway %s --help failed: %s" % (cmd, r.stderr)):
            continue
        entries = help_entries(r.stdout)
        for flag, key in flags.items():
            e = entries.get(flag)
            if not check(e is not None, "spillway %s --help: no %s" % (cmd, flag)):
                continue
            if not check(key in keys, "%s %s: no key %s in the table" % (cmd, flag, key)):
                continue
            section, default, values, meaning = keys[key]
            m = re.search(r"\[([\w.]+); default (\S*?)(?:; (.*))?\]$", e)
            if not check(m, "spillway %s --help: %s does not name its key: %s" % (cmd, flag, e)):
                continue
            check(m.group(1) == key, "%s %s names key %s, not %s" % (cmd, flag, m.group(1), key))
            shown = "" if m.group(2) == '""' else m.group(2)
            check(shown == default, "%s %s: default %r, the key's is %r" % (cmd, flag, shown,
                                                                            default))
            want_values = values.replace(" | ", "|")
            check((m.group(3) or "") == want_values,
                  "%s %s: values %r, the key's are %r" % (cmd, flag, m.group(3), want_values))
            if flag not in OWN_WORDS:
                text = e[len(flag):m.start()].strip()
                text = re.sub(r"^\S+ +", "", text) if not text.startswith(meaning) else text
                check(text == meaning, "%s %s: help %r, the key's meaning is %r"
                      % (cmd, flag, text, meaning))
            if cmd == "generate":
                check_range(binary, flag, key, values)


def check_range(binary, flag, key, values):
    """The parser accepts the key's bounds / choices and refuses one beyond (exit 2)."""
    def status(value):
        arg = "localhost:" + value if flag == "--cache-redis" else value
        r = run(binary, "generate", "-m", "/nonexistent/model.gguf", flag, arg, "-p", "x")
        return r.returncode, r.stderr
    m = re.fullmatch(r"(-?\d+)\.\.(-?\d+)", values)
    if m:
        lo, hi = int(m.group(1)), int(m.group(2))
        for v in (lo, hi):
            rc, err = status(str(v))
            check(rc == 1, "generate %s %d (in the key's range %s): exit %d, want 1 (no model): %s"
                  % (flag, v, values, rc, err.strip()))
        for v in (lo - 1, hi + 1):
            rc, err = status(str(v))
            check(rc == 2 and key in err, "generate %s %d (outside %s): exit %d, want 2 naming %s: %s"
                  % (flag, v, values, rc, key, err.strip()))
    elif "|" in values and flag != "--no-prefix-cache":
        for v in values.split(" | "):
            rc, err = status(v)
            check(rc == 1, "generate %s %s: exit %d, want 1 (no model): %s" % (flag, v, rc, err))
        rc, err = status("bogus")
        check(rc == 2 and key in err, "generate %s bogus: exit %d, want 2 naming %s: %s"
              % (flag, rc, key, err.strip()))


def main():
    args = sys.argv[1:]
    if not args or not os.access(args[0], os.X_OK):
        print("skip: no spillway binary given")
        return 77
    binary = args[0]
    r = run(binary, "config", "--markdown")
    if not check(r.returncode == 0, "spillway config --markdown failed: " + r.stderr):
        return 1
    md = r.stdout
    keys, order = parse_markdown(md)
    check(len(keys) > 50, "only %d keys in the markdown" % len(keys))

    s, a, b = readme_part()
    if a is None:
        return 1
    if "--write" in args:
        open(README, "w", encoding="utf-8").write(s[:a] + md + s[b:])
        print("README.md: %d keys written" % len(keys))
        return 0
    have, have_order = parse_markdown(s[a:b])
    missing = [k for k in order if k not in have]
    extra = [k for k in have_order if k not in keys]
    check(not missing, "keys missing from README.md: " + " ".join(missing))
    check(not extra, "keys in README.md the binary does not know: " + " ".join(extra))
    for k in order:
        if k in have and have[k] != keys[k]:
            check(False, "README.md's row of %s differs:\n  README: %r\n  binary: %r"
                  % (k, have[k], keys[k]))
    if s[a:b] != md:
        diff = [(i + 1, x, y) for i, (x, y) in
                enumerate(zip(s[a:b].split("\n"), md.split("\n"))) if x != y][:3]
        check(False, "README.md's generated part is not `spillway config --markdown`'s output "
              "(first differing lines %s); rerun: %s %s --write" % (diff, sys.argv[0], binary))

    r = run(binary, "config", "--keys")
    if check(r.returncode == 0, "spillway config --keys failed: " + r.stderr):
        listed = {}
        for line in r.stdout.split("\n"):
            m = re.match(r"(\S+) += (\S*) +# ", line)
            if line.strip() and check(m, "config --keys: odd line %r" % line):
                listed[m.group(1)] = "" if m.group(2) == '""' else m.group(2)
        check(list(listed) == order, "config --keys and --markdown list different keys")
        for k, d in listed.items():
            check(k not in keys or keys[k][1] == d, "config --keys: %s default %r, markdown %r"
                  % (k, d, keys[k][1] if k in keys else None))

    check_flags(binary, keys)

    r = run(binary, "worker", "--help")
    offered = help_entries(r.stdout)
    check(r.returncode == 0 and "worker.id" in r.stdout and "--keys" not in offered
          and "--check" not in offered and "-i" in offered,
          "spillway worker --help must name worker.id and not offer --keys/--check:\n" + r.stdout)

    if failures:
        print("%d failure(s)" % len(failures))
        return 1
    print("ok: %d keys in %d sections; README, --keys and the flags of %s agree"
          % (len(keys), len({v[0] for v in keys.values()}), ", ".join(FLAGS)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
