#!/usr/bin/env python3
"""Chat-template test cases: renders every conversation below with every template under
templates/ through jinja2, set up the way Hugging Face transformers' apply_chat_template sets it
up (sandboxed environment, trim_blocks, lstrip_blocks, loopcontrols, its own tojson filter,
raise_exception and strftime_now globals; messages, tools=None, documents=None,
add_generation_prompt and the special tokens as variables).

  gen.py            (re)writes cases/<template>/<conversation>.json and, next to each, the
                    template's output (.expected) or the exception it raised (.error)
  gen.py --check    renders again and compares with the files (tests/test_chat_templates.py)

Case file: {"template": name, "messages": [{"role", "content"}...], "add_generation_prompt":
bool, "enable_thinking": bool (only when the conversation sets it), "date": "YYYY-MM-DD" (the
day strftime_now sees)}. .error holds "<exception class>: <message>"."""
import datetime
import json
import os
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))

# bos_token, eos_token of each template's model (their tokenizer_config.json)
TOKENS = {
    "llama-3": ("<|begin_of_text|>", "<|eot_id|>"),
    "llama-3.1": ("<|begin_of_text|>", "<|eot_id|>"),
    "llama-3.2": ("<|begin_of_text|>", "<|eot_id|>"),
    "qwen2.5": (None, "<|im_end|>"),
    "qwen3": (None, "<|im_end|>"),
    "gemma-2": ("<bos>", "<eos>"),
    "gemma-3": ("<bos>", "<eos>"),
    "phi-3": ("<s>", "<|endoftext|>"),
    "phi-3.5": ("<s>", "<|endoftext|>"),
    "mistral-v0.3": ("<s>", "</s>"),
    "mistral-nemo": ("<s>", "</s>"),
}

DATE = "2026-12-02"


def S(c):
    return {"role": "system", "content": c}


def U(c):
    return {"role": "user", "content": c}


def A(c):
    return {"role": "assistant", "content": c}


def T(c):
    return {"role": "tool", "content": c}


# name: (messages, add_generation_prompt, extra case keys)
CONVERSATIONS = {
    "sys-multi": ([S("You are a helpful assistant"), U("Hello"), A("Hi there"),
                   U("Who are you")], True, {}),
    "sys-multi-nogen": ([S("You are a helpful assistant"), U("Hello"), A("Hi there"),
                         U("Who are you")], False, {}),
    "sys-ends-assistant": ([S("Be brief."), U("2+2?"), A("4")], False, {}),
    "nosys-multi": ([U("Hello"), A("Hi there"), U("Who are you")], True, {}),
    "single-user": ([U("What is the capital of France?")], True, {}),
    "single-user-nogen": ([U("What is the capital of France?")], False, {}),
    "llama-cpp-six": ([S("You are a helpful assistant"), U("Hello"), A("Hi there"),
                       U("Who are you"), A("   I am an assistant   "), U("Another question")],
                      True, {}),
    "whitespace": ([S("\n  Sys with spaces \t\n"), U("  hi\u00a0\u3000 "),
                    A("\u2003 answer\n\n"), U("\tlast\u2028")], True, {}),
    "multiline-unicode": ([S("Réponds en français.\nLigne 2."), U("Ça va ? 😀\n\nDeux lignes"),
                           A("Oui.\n```\ncode\n```"), U("Et \"toi\" \\ 'moi'?")], True, {}),
    "control-text": ([S("<|im_start|>system\n[INST]"), U("<|eot_id|><start_of_turn>model\n"),
                      A("</s><|end|><|im_end|>"), U("<s>[/INST]<|start_header_id|>")], True, {}),
    "empty-system": ([S(""), U("Hi")], True, {}),
    "empty": ([], True, {}),
    "double-user": ([U("one"), U("two")], True, {}),
    "starts-assistant": ([A("I start"), U("then you")], True, {}),
    "second-system": ([S("first"), U("u1"), S("second"), U("u2")], True, {}),
    "system-at-odd": ([U("u1"), S("mid"), U("u2")], True, {}),
    "tool": ([S("Use tools."), U("Weather in Paris?"), A("Calling the tool."),
              T("{\"temp\": 21, \"city\": \"Paris\"}\n<é>\u0001"), T("second result"),
              U("Thanks")], True, {}),
    "other-role": ([U("hi"), {"role": "developer", "content": "dev note"}, U("again")], True, {}),
    "think-history": ([U("What is 1+1?"),
                       A("<think>\nOne plus one.\n</think>\n\n2"),
                       U("And 2+2?")], True, {}),
    "think-last": ([U("What is 1+1?"), A("<think>\nOne plus one.\n</think>\n\n2")], False, {}),
    "think-off": ([U("What is 1+1?"), A("<think>\nr\n</think>\n\n2"), U("And 2+2?")], True,
                  {"enable_thinking": False}),
    "think-on": ([U("Hi")], True, {"enable_thinking": True}),
    "think-tools": ([U("Weather?"), A("<think>\nneed tool\n</think>\n\nLet me check."),
                     T("sunny"), A("\n<think>\nsaw result\n</think>\n\nIt is sunny."),
                     A("no think here")], False, {}),
    "think-tool-response-user": ([U("q1"), A("<think>a</think>x"),
                                  U("<tool_response>\nr\n</tool_response>"),
                                  A("<think>b</think>\n\ny")], False, {}),
    "think-odd": ([U("q"), A("pre<think>x</think>mid</think>\n\nend")], True, {}),
}


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def environment(date):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    day = datetime.datetime.strptime(date, "%Y-%m-%d")
    env.globals["strftime_now"] = lambda fmt: day.strftime(fmt)
    return env


def render(case):
    """The template's output for case (text, None) or the exception it raised (None, text)."""
    name = case["template"]
    with open(os.path.join(HERE, "templates", name + ".jinja"), encoding="utf-8") as f:
        src = f.read()
    env = environment(case.get("date", DATE))
    bos, eos = TOKENS[name]
    kw = {"messages": case["messages"], "tools": None, "documents": None,
          "add_generation_prompt": case["add_generation_prompt"],
          "bos_token": bos, "eos_token": eos}
    if "enable_thinking" in case:
        kw["enable_thinking"] = case["enable_thinking"]
    try:
        return env.from_string(src).render(**kw), None
    except jinja2.exceptions.TemplateError as e:
        return None, "%s: %s" % (type(e).__name__, e)


def cases():
    for name in sorted(TOKENS):
        for conv in sorted(CONVERSATIONS):
            if conv.startswith("think-") and not name.startswith("qwen"):
                continue
            msgs, agp, extra = CONVERSATIONS[conv]
            case = {"template": name, "messages": msgs, "add_generation_prompt": agp}
            case.update(extra)
            if name == "llama-3.2":
                case["date"] = DATE
            yield name, conv, case


def paths(name, conv):
    base = os.path.join(HERE, "cases", name, conv)
    return base + ".json", base + ".expected", base + ".error"


def main():
    check = "--check" in sys.argv[1:]
    bad = n = 0
    for name, conv, case in cases():
        pj, pe, perr = paths(name, conv)
        if check:
            with open(pj, encoding="utf-8") as f:
                case = json.load(f)
        text, err = render(case)
        want = (pe, text) if text is not None else (perr, err)
        other = perr if text is not None else pe
        n += 1
        if check:
            try:
                with open(want[0], "rb") as f:
                    ok = f.read() == want[1].encode("utf-8")
            except FileNotFoundError:
                ok = False
            if not ok or os.path.exists(other):
                bad += 1
                print("MISMATCH %s/%s: jinja2 gives %s" % (name, conv, want[1][:200]))
            continue
        os.makedirs(os.path.dirname(pj), exist_ok=True)
        with open(pj, "w", encoding="utf-8") as f:
            json.dump(case, f, ensure_ascii=False, indent=1)
            f.write("\n")
        with open(want[0], "wb") as f:
            f.write(want[1].encode("utf-8"))
        if os.path.exists(other):
            os.remove(other)
    print("%d cases, %d mismatches (jinja2 %s)" % (n, bad, jinja2.__version__))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
