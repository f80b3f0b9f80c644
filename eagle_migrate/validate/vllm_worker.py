"""Runs inside the vLLM Python (``python -m eagle_migrate.validate.vllm_worker``): one JSON request on stdin,
one JSON result as the last line of stdout. Kept free of eagle_migrate imports beyond the standard library so it
runs in any Python that has vLLM (``--vllm-python``), whatever torch that Python pins.

Request: {"target", "drafter" (or null for no speculation), "method", "num_speculative_tokens", "dtype",
"max_model_len", "tensor_parallel_size", "seed", "enforce_eager", "gpu_memory_utilization",
"suites": {name: {"prompts": [[token ids]] | ["text"], "max_tokens": int}}, "temperature", "skip_tokenizer_init"}
Result: {"ok": true, "suites": {name: {counters..., "outputs": [[ids]], "seconds": s, "output_tokens": n}}, "vllm_version"}
"""

from __future__ import annotations

import json
import os
import sys
import time

RESULT_MARK = "EAGLE_MIGRATE_RESULT "


def _counters(llm) -> dict:
    out = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "accepted_per_position": []}
    names = {
        "vllm:spec_decode_num_drafts": "num_drafts",
        "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
        "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens",
    }
    for m in llm.get_metrics():
        if m.name in names:
            out[names[m.name]] += int(m.value)
        elif m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            vals = [int(v) for v in m.values]
            acc = out["accepted_per_position"]
            acc.extend([0] * (len(vals) - len(acc)))
            for i, v in enumerate(vals):
                acc[i] += v
    return out


def _delta(a: dict, b: dict) -> dict:
    n = max(len(a["accepted_per_position"]), len(b["accepted_per_position"]))
    pa = a["accepted_per_position"] + [0] * (n - len(a["accepted_per_position"]))
    pb = b["accepted_per_position"] + [0] * (n - len(b["accepted_per_position"]))
    return {
        "num_drafts": a["num_drafts"] - b["num_drafts"],
        "num_draft_tokens": a["num_draft_tokens"] - b["num_draft_tokens"],
        "num_accepted_tokens": a["num_accepted_tokens"] - b["num_accepted_tokens"],
        "accepted_per_position": [x - y for x, y in zip(pa, pb)],
    }


def run(req: dict) -> dict:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kw = dict(
        model=req["target"],
        dtype=req.get("dtype", "auto"),
        max_model_len=req.get("max_model_len", 2048),
        max_num_seqs=req.get("max_num_seqs", 8),
        seed=req.get("seed", 0),
        enforce_eager=req.get("enforce_eager", True),
        disable_log_stats=False,
        skip_tokenizer_init=req.get("skip_tokenizer_init", False),
        tensor_parallel_size=req.get("tensor_parallel_size", 1),
    )
    if req.get("gpu_memory_utilization") is not None:
        kw["gpu_memory_utilization"] = req["gpu_memory_utilization"]
    if req.get("drafter"):
        kw["speculative_config"] = {
            "model": req["drafter"],
            "method": req.get("method", "eagle3"),
            "num_speculative_tokens": req.get("num_speculative_tokens", 3),
        }
    llm = LLM(**kw)
    result = {"ok": True, "vllm_version": vllm.__version__, "suites": {}}
    for name, suite in req["suites"].items():
        sp = SamplingParams(
            max_tokens=suite.get("max_tokens", 64),
            temperature=req.get("temperature", 0.0),
            ignore_eos=suite.get("ignore_eos", False),
            seed=req.get("seed", 0),
            detokenize=False,
        )
        prompts = [TokensPrompt(prompt_token_ids=p) if isinstance(p, list) else p for p in suite["prompts"]]
        before = _counters(llm) if req.get("drafter") else None
        t0 = time.perf_counter()
        outs = llm.generate(prompts, sp, use_tqdm=False)
        dt = time.perf_counter() - t0
        res = _delta(_counters(llm), before) if before is not None else {}
        res["outputs"] = [list(o.outputs[0].token_ids) for o in outs]
        res["output_tokens"] = sum(len(x) for x in res["outputs"])
        res["seconds"] = dt
        res["num_prompts"] = len(prompts)
        result["suites"][name] = res
    return result


def main() -> None:
    req = json.loads(sys.stdin.read())
    try:
        res = run(req)
    except Exception as e:  # reported to the parent as data; the parent decides how to show it
        res = {"ok": False, "error": f"{e.__class__.__name__}: {e}"}
    sys.stdout.write("\n" + RESULT_MARK + json.dumps(res) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
