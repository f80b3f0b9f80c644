"""A team's traffic for the retarget test bed: the request log of a coding assistant, as `convert --data FILE` and
`validate --prompts FILE` read it (OpenAI chat messages, one request a line).

Each request is the product's system prompt (SYSTEM below) and a first user turn from ShareGPT that asks about code,
from record START on: the validate suites sample ShareGPT's first 3,000 records, the sources and arm 0 trained on
records 5,000-6,199, so no request here is one of theirs. Deterministic (file order, no sampling).

    .venv/bin/python benchmarks/retarget/make_traffic.py runs/retarget/traffic/code.jsonl [--n 400] [--start 12000]
    .venv/bin/python benchmarks/retarget/make_traffic.py runs/retarget/traffic/chat.jsonl --kind chat --start 3000

``--kind chat``: ShareGPT's first user turns as they are, from record 3,000 on (where `--data sharegpt` trains): the
default data's prompts, answered by the target instead of ShareGPT's replies (the control for the data's text).

Writes FILE (every request: what convert --data reads) and FILE's held-out part under another name,
`<stem>.served.jsonl`, by convert's own rule (`corpora.split_traffic`): the prompts `convert --data FILE` holds out
for its judge and never trains on, which `validate --prompts` serves for the arms (a file named
`<stem>.heldout.jsonl` would be read by convert as a triage's held-out part; this one is not).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from eagle_migrate import corpora
from eagle_migrate.corpora import sources

SYSTEM = ("You are CodePilot, the coding assistant of a software company's internal developer portal. Answer the "
          "engineer's question directly. Prefer Python unless the question names another language, put code in "
          "fenced blocks with the language named, keep explanations short, and point out bugs, edge cases and "
          "security issues you notice.")
CODE = re.compile(r"```|\bpython\b|\bjavascript\b|\bsql\b|\bfunction\b|\bcode\b|\bscript\b|\bjava\b|\bc\+\+|"
                  r"\breact\b|\bapi\b|\bbug\b|\berror\b", re.I)


def requests(n: int, start: int, kind: str = "code") -> list[dict]:
    """``code``: the coding assistant's requests (SYSTEM and a code question); ``chat``: ShareGPT's first user turns
    as they are (no system prompt, any topic): the prompts of the default data, for the target to answer."""
    out: list[dict] = []
    for i, rec in enumerate(sources.iter_sharegpt(sources.sharegpt_file())):
        if i < start:
            continue
        turns = rec.get("conversations") or []
        if not turns or turns[0].get("from") not in ("human", "user"):
            continue
        q = turns[0].get("value", "")
        if not (40 <= len(q) <= 2000 and sum(c.isascii() for c in q) > 0.97 * len(q)):
            continue
        if kind == "code" and not CODE.search(q):
            continue
        system = [{"role": "system", "content": SYSTEM}] if kind == "code" else []
        out.append({"messages": [*system, {"role": "user", "content": q}]})
        if len(out) == n:
            break
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--start", type=int, default=12000)
    ap.add_argument("--kind", choices=("code", "chat"), default="code")
    a = ap.parse_args()
    reqs = requests(a.n, a.start, a.kind)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text("".join(json.dumps(r) + "\n" for r in reqs))
    convs = sources.load_conversations(a.out)  # read back as convert reads it: the split is over these
    _train, held = corpora.split_traffic(convs)
    served = a.out.with_name(a.out.name.removesuffix(".jsonl") + ".served.jsonl")
    served.write_text("".join(json.dumps({"messages": c.messages}) + "\n" for c in held))
    print(json.dumps({"requests": len(reqs), "held_out": len(held), "file": str(a.out), "served": str(served)}))


if __name__ == "__main__":
    main()
