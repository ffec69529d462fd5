#!/usr/bin/env python3
"""Proves that tests/chat_templates/cases/*/*.expected and *.error (the texts test_chat_templates.c
holds spillway's Jinja-exact chat templates to) are what the models' own Jinja templates give:
renders every case again with jinja2, the way Hugging Face transformers' apply_chat_template does
(tests/chat_templates/gen.py --check), and compares bytes. Exit 77 without python3-jinja2.

Args (as every script test gets them): <spillway binary> <models dir>; neither is used."""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

import pycommon

pycommon.import_or_skip(
    "jinja2", "SKIP: python3-jinja2 is not installed (scripts/install-deps.sh installs it)")

r = subprocess.run([sys.executable, os.path.join(HERE, "chat_templates", "gen.py"), "--check"],
                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
print(r.stdout, end="")
if r.returncode != 0 or " 0 mismatches" not in r.stdout:
    print("FAIL: the expected files are not the templates' output")
    sys.exit(1)
# the check must have seen every case file
n_files = sum(f.endswith(".json") for _, _, fs in os.walk(os.path.join(HERE, "chat_templates",
                                                                       "cases")) for f in fs)
n_checked = int(r.stdout.split(" cases,")[0].split()[-1])
if n_checked != n_files or n_files < 100:
    print("FAIL: %d case files, %d checked" % (n_files, n_checked))
    sys.exit(1)
print("PASS")
