#!/usr/bin/env python3
"""tests/batch_make_input.py N BAD OUT [MAX_TOKENS]: writes an OpenAI Batch input file of N lines for
tests/test_batch.sh: chat and completions requests (some sharing a prefix, some with logprobs,
stop, seed, n, content parts, metadata, unknown fields), of which BAD are lines spillway must
answer with an error line, of varied kinds (refused by the mapping, dead-lettered by the worker,
expired). OUT.expect gets one line per custom_id: "ok", or "error KIND" for a bad line. Prints
the kinds used, with their counts, to stderr. Deterministic."""
import json
import sys

n, n_bad, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
mt = int(sys.argv[4]) if len(sys.argv) > 4 else 6

# each bad kind: a function of i -> (url, body)
BAD = [
    ("bad_url", lambda i: ("/v1/embeddings", {"input": "x", "model": "m"})),
    ("tools", lambda i: ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                   "tools": [{"type": "function", "function": {"name": "f"}}]})),
    ("image_part", lambda i: ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]})),
    ("logit_bias", lambda i: ("/v1/completions", {"prompt": "Once", "logit_bias": {"50": 1}})),
    ("stream", lambda i: ("/v1/completions", {"prompt": "Once", "stream": True})),
    ("no_prompt", lambda i: ("/v1/completions", {"max_tokens": 4})),
    ("max_tokens_0", lambda i: ("/v1/completions", {"prompt": "Once", "max_tokens": 0})),
    ("temperature_str", lambda i: ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}],
                                                             "temperature": "hot"})),
    ("top_p_2", lambda i: ("/v1/completions", {"prompt": "Once", "top_p": 2})),
    ("bad_role", lambda i: ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "a"}]})),
    ("expired", lambda i: ("/v1/completions", {"prompt": "Once upon", "max_tokens": 8,
                                                "deadline": "2001-01-01T00:00:00Z"})),
    ("top_logprobs_no_logprobs", lambda i: ("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "a"}], "top_logprobs": 2})),
    ("several_prompts", lambda i: ("/v1/completions", {"prompt": ["a", "b"]})),
    ("echo", lambda i: ("/v1/completions", {"prompt": "Once", "echo": True})),
    ("stop_too_many", lambda i: ("/v1/completions", {"prompt": "Once", "stop": [str(k) for k in range(40)]})),
]

PROMPTS = ["Once upon a time", "Once upon a time, there was a little", "The dog", "Lily and Tom",
           "One day, a big"]

kinds = {}
with open(out, "w") as f, open(out + ".expect", "w") as ex:
    bad_at = set(range(3, n, max(1, n // n_bad))[:n_bad]) if n_bad else set()
    k = 0
    for i in range(n):
        cid = "req-%04d" % i
        if i in bad_at:
            name, fn = BAD[k % len(BAD)]
            k += 1
            url, body = fn(i)
            kinds[name] = kinds.get(name, 0) + 1
            ex.write("%s error %s\n" % (cid, name))
        elif i % 2 == 0:
            url = "/v1/chat/completions"
            content = PROMPTS[i % len(PROMPTS)]
            if i % 10 == 4:
                content = [{"type": "text", "text": content[:5]}, {"type": "text", "text": content[5:]}]
            body = {"model": "stories260K", "messages": [{"role": "system", "content": "Be brief."},
                                                          {"role": "user", "content": content}],
                    "max_completion_tokens": mt, "temperature": 0.8, "seed": i, "user": "u%d" % (i % 3),
                    "some_future_field": {"x": 1}}
            if i % 6 == 0:
                body["logprobs"] = True
                body["top_logprobs"] = 2
            if i % 8 == 0:
                body["metadata"] = {"n": i, "tag": "t"}
            if i % 50 == 20:
                body["n"] = 2
        else:
            url = "/v1/completions"
            body = {"model": "stories260K", "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": mt,
                    "top_p": 0.9, "stop": ["\n"], "presence_penalty": 0.1, "frequency_penalty": 0.1}
            if i % 7 == 0:
                body["logprobs"] = 2
            if i % 50 == 11:
                body["n"] = 3
                body["seed"] = i
        if i not in bad_at:
            ex.write("%s ok\n" % cid)
        f.write(json.dumps({"custom_id": cid, "method": "POST", "url": url, "body": body}) + "\n")
for name in sorted(kinds):
    print(name, kinds[name], file=sys.stderr)
