"""Runs inside the vLLM Python (``python -m eagle_migrate.engines.vllm_worker``): one JSON request on stdin,
one JSON result as the last line of stdout. Kept free of eagle_migrate imports beyond the standard library so it
runs in any Python that has vLLM (``--vllm-python``), whatever torch that Python pins.

Request: {"target", "drafter" (or null for no speculation), "method", "num_speculative_tokens", "dtype",
"max_model_len", "tensor_parallel_size", "seed", "enforce_eager", "gpu_memory_utilization",
"suites": {name: {"prompts": [[token ids]] | ["text"], "max_tokens": int, "ignore_eos": bool}},
"temperature", "skip_tokenizer_init", "record_drafts" (opt-in), "per_request_metrics" (opt-in), "runs" (optional),
"attention_backend" (the target's ``attention_config.backend``, null = vLLM chooses)}

``runs``: a list of {"drafter": path | null, "num_speculative_tokens"?, "suites"?, "draft_attention_backend"?
(the drafter's ``speculative_config["attention_backend"]``; attention_backend.py says why both)} run one after the other in this
one process against the same target (each run builds its own ``LLM``; counters never leak between them). Without
``runs`` the top-level ``drafter``/``suites`` make the single run.

``record_drafts: true`` hooks the EAGLE proposer (in-process engine only, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``) and
returns, per prompt, every proposal vLLM made: ``{"n": i, "next_token": x_i, "drafts": [d_1..d_k]}`` where ``n``
is the index of the just-verified token in prompt+output (the drafter saw x_0..x_i, target states at 0..i-1).
Prompts are then generated one at a time so each proposal belongs to exactly one prompt.

``per_request_metrics: true`` turns on vLLM's per-request spec-decode metrics and returns, per suite,
``per_request``: per prompt {"num_drafts", "num_draft_tokens", "num_accepted_tokens", "accepted_per_position"}
(the unit a standard error needs; their sums are the suite's counters), null entries on a vLLM without
``per_request_spec_decode_metrics``.

A run vLLM refuses (its engine does not build, e.g. a drafter it cannot load) gets {"drafter", "error": "Class:
message", "suites": {}} and the next run still runs.
Result: {"ok": true, "vllm_version", "suites": {...} (first run), "runs": [{"drafter", "suites": {name: {counters...,
"outputs": [[ids]], "seconds": s, "output_tokens": n, "num_prompts": n, "drafts"?: [[records]],
"per_request"?: [{counters}]}}}]}
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time

RESULT_MARK = "EAGLE_MIGRATE_RESULT "
PROGRESS_MARK = "EAGLE_MIGRATE_PROGRESS "  # a stderr line per finished suite: {"done", "total", "info"} (all runs)

_PROGRESS = {"done": 0, "total": 0}


def _progress(info: str) -> None:
    """One progress line on stderr (the parent reads it while the worker runs: vllm_engine.run_worker)."""
    sys.stderr.write(PROGRESS_MARK + json.dumps({"done": _PROGRESS["done"], "total": _PROGRESS["total"], "info": info}) + "\n")
    sys.stderr.flush()

_RECORDS: list | None = None  # proposals of the prompt in flight when record_drafts is on


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


def _install_draft_recorder() -> None:
    """Wrap the EAGLE proposer's ``propose`` (class level, so the in-process engine's instance picks it up)."""
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer  # lazy: vllm is optional: the parent imports this module for its markers, vLLM runs in the worker's Python

    if getattr(SpecDecodeBaseProposer.propose, "_eagle_migrate_hook", False):
        return
    orig = SpecDecodeBaseProposer.propose

    def propose(self, num_speculative_tokens, target_token_ids, target_positions, target_hidden_states,
                next_token_ids, token_indices_to_sample, common_attn_metadata, *args, **kwargs):
        idx = token_indices_to_sample
        if idx is None:
            idx = common_attn_metadata.query_start_loc[1:] - 1
        pos = target_positions[..., idx.long()].reshape(-1).tolist() if target_positions.dim() == 1 else None
        nxt = next_token_ids.reshape(-1).tolist()
        out = orig(self, num_speculative_tokens, target_token_ids, target_positions, target_hidden_states,
                   next_token_ids, idx if token_indices_to_sample is not None else None, common_attn_metadata,
                   *args, **kwargs)
        if _RECORDS is not None:
            drafts = out.tolist() if hasattr(out, "tolist") else [list(x) for x in out]
            for r, d in enumerate(drafts):
                _RECORDS.append({"n": (pos[r] + 1) if pos is not None else None, "next_token": nxt[r], "drafts": d})
        return out

    propose._eagle_migrate_hook = True  # type: ignore[attr-defined]
    SpecDecodeBaseProposer.propose = propose


def engine_arg_exists(name: str) -> bool:
    """Whether this vLLM's ``EngineArgs`` has the field ``name`` (an older vLLM lacks per-request spec-decode metrics:
    its ``per_request`` entries are then null and validate reports no standard error, saying why, instead of
    failing to build the engine)."""
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs  # lazy: vllm is optional: the parent imports this module for its markers, vLLM runs in the worker's Python

    return name in {f.name for f in dataclasses.fields(EngineArgs)}


def _engine_kwargs(req: dict, drafter: str | None, k: int, draft_backend: str | None = None) -> dict:
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
    if req.get("max_num_batched_tokens") is not None:
        kw["max_num_batched_tokens"] = req["max_num_batched_tokens"]
    if req.get("attention_backend"):
        kw["attention_config"] = {"backend": req["attention_backend"]}
    if drafter and req.get("per_request_metrics") and engine_arg_exists("per_request_spec_decode_metrics"):
        kw["per_request_spec_decode_metrics"] = "summary"  # each output then carries its own acceptance histogram
    if drafter:
        kw["speculative_config"] = {
            "model": drafter,
            "method": req.get("method", "eagle3"),
            "num_speculative_tokens": k,
        }
        if draft_backend:
            kw["speculative_config"]["attention_backend"] = draft_backend
    return kw


def _request_metrics(o) -> dict | None:
    """One request's counters from vLLM's per-request histogram (``acceptance_histogram[j]`` = verify steps that
    accepted j drafts): drafts, accepted, and accepted per position (position i accepted <=> j > i)."""
    m = getattr(o.outputs[0], "spec_decode_metrics", None)
    if m is None:
        return None
    hist = list(m.to_dict()["acceptance_histogram"])
    return {"num_drafts": sum(hist), "num_draft_tokens": int(m.num_draft_tokens),
            "num_accepted_tokens": sum(j * c for j, c in enumerate(hist)),
            "accepted_per_position": [sum(hist[i + 1:]) for i in range(len(hist) - 1)]}


def _run_one(req: dict, drafter: str | None, k: int, suites: dict, draft_backend: str | None = None) -> dict:
    global _RECORDS
    from vllm import LLM, SamplingParams  # lazy: vllm is optional: the parent imports this module for its markers, vLLM runs in the worker's Python
    from vllm.inputs import TokensPrompt  # lazy: vllm is optional: the parent imports this module for its markers, vLLM runs in the worker's Python

    record = bool(req.get("record_drafts")) and bool(drafter)
    llm = LLM(**_engine_kwargs(req, drafter, k, draft_backend))
    out: dict = {}
    try:
        for name, suite in suites.items():
            sp = SamplingParams(
                max_tokens=suite.get("max_tokens", 64),
                temperature=req.get("temperature", 0.0),
                top_p=req.get("top_p", 1.0),
                ignore_eos=suite.get("ignore_eos", False),
                seed=req.get("seed", 0),
                detokenize=False,
            )
            prompts = [TokensPrompt(prompt_token_ids=p) if isinstance(p, list) else p for p in suite["prompts"]]
            before = _counters(llm) if drafter else None
            t0 = time.perf_counter()
            drafts: list[list[dict]] = []
            if record:
                outs = []
                for p in prompts:
                    _RECORDS = []
                    outs += llm.generate([p], sp, use_tqdm=False)
                    drafts.append(_RECORDS)
                    _RECORDS = None
            else:
                outs = llm.generate(prompts, sp, use_tqdm=False)
            dt = time.perf_counter() - t0
            res = _delta(_counters(llm), before) if before is not None else {}
            res["outputs"] = [list(o.outputs[0].token_ids) for o in outs]
            res["prompt_token_ids"] = [list(o.prompt_token_ids or []) for o in outs] if req.get("return_prompt_ids") else None
            res["output_tokens"] = sum(len(x) for x in res["outputs"])
            res["seconds"] = dt
            res["num_prompts"] = len(prompts)
            if record:
                res["drafts"] = drafts
            if drafter and req.get("per_request_metrics"):
                res["per_request"] = [_request_metrics(o) for o in outs]
            out[name] = res
            _PROGRESS["done"] += 1
            _progress(f"{name}: {len(prompts)} prompts in {dt:.0f} s" + (f" ({os.path.basename(str(drafter))})" if drafter else ""))
    finally:
        del llm
        gc.collect()
    return out


def _assume_amx() -> None:
    """``EAGLE_MIGRATE_ASSUME_AMX=1`` (tests only): vLLM's AMX probe answers yes, so a host without AMX selects
    backends as an AMX host does (attention_backend.py)."""
    if os.environ.get("EAGLE_MIGRATE_ASSUME_AMX") == "1":
        import torch  # lazy: torch, as vllm (tests only)

        torch.cpu._is_amx_tile_supported = lambda: True


def run(req: dict) -> dict:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    _assume_amx()
    import vllm  # lazy: vllm is optional here, and reads VLLM_ENABLE_V1_MULTIPROCESSING when imported

    if req.get("record_drafts"):
        if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") != "0":
            raise RuntimeError("record_drafts needs the in-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0)")
        _install_draft_recorder()
    runs = req.get("runs") or [{"drafter": req.get("drafter")}]
    result: dict = {"ok": True, "vllm_version": vllm.__version__, "runs": []}
    _PROGRESS["total"] = sum(len(r.get("suites") or req["suites"]) for r in runs)
    for i, r in enumerate(runs):
        k = int(r.get("num_speculative_tokens", req.get("num_speculative_tokens", 3)))
        t0 = time.perf_counter()
        _progress(f"loading the engine ({'target alone' if not r.get('drafter') else os.path.basename(str(r['drafter']))}"
                  + (f", run {i + 1} of {len(runs)}" if len(runs) > 1 else "") + ")")
        try:
            suites = _run_one(req, r.get("drafter"), k, r.get("suites") or req["suites"], r.get("draft_attention_backend"))
        except Exception as e:  # vLLM refused this drafter: say which, keep what the other runs measure
            import traceback

            traceback.print_exc(file=sys.stderr)
            result["runs"].append({"drafter": r.get("drafter"), "num_speculative_tokens": k, "suites": {},
                                   "error": f"{e.__class__.__name__}: {e}", "seconds": time.perf_counter() - t0})
            _PROGRESS["done"] = sum(len(x.get("suites") or req["suites"]) for x in runs[:i + 1])
            continue
        result["runs"].append({"drafter": r.get("drafter"), "num_speculative_tokens": k, "suites": suites,
                               "seconds": time.perf_counter() - t0})
    result["suites"] = result["runs"][0]["suites"]
    return result


PARENT_ENV = "EAGLE_MIGRATE_PARENT_PID"


def die_with_parent() -> None:
    """End this process when the eagle-migrate process that started it dies (even by SIGKILL), so a killed run
    never leaves a worker holding memory or a GPU: Linux's parent-death signal (``prctl(PR_SET_PDEATHSIG,
    SIGKILL)``), plus a watcher thread that exits when the parent's pid is no longer our parent (other systems,
    and a parent that died before the signal was armed)."""
    import signal
    import threading

    want = os.environ.get(PARENT_ENV)
    parent = int(want) if want and want.isdigit() else os.getppid()
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            pr_set_pdeathsig = 1
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the parent is already gone
        os._exit(137)

    def watch() -> None:
        while True:
            time.sleep(0.2)
            if os.getppid() != parent:
                os._exit(137)

    threading.Thread(target=watch, name="eagle-migrate-parent-watch", daemon=True).start()


def main() -> None:
    die_with_parent()
    req = json.loads(sys.stdin.read())
    try:
        res = run(req)
    except Exception as e:  # reported to the parent as data; the parent decides how to show it
        import traceback

        traceback.print_exc(file=sys.stderr)
        res = {"ok": False, "error": f"{e.__class__.__name__}: {e}"}
    sys.stdout.write("\n" + RESULT_MARK + json.dumps(res) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
