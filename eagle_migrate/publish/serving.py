"""How a published drafter is served: the ``--speculative-config`` dict (``speculative_config.json``; the dict itself
is ``formats.vllm.speculative_config``, the one definition quantize reports too) and the vLLM / SGLang commands the
card and ``PublishResult`` show.

Imports: ``formats.vllm``.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from ..formats.vllm import speculative_config

TARGET_PLACEHOLDER = "TARGET_MODEL"


def repo_speculative_config(repo_id: str, num_speculative_tokens: int) -> dict[str, Any]:
    """The ``--speculative-config`` of the drafter at ``repo_id`` (what ``speculative_config.json`` holds)."""
    return speculative_config(repo_id, num_speculative_tokens)


def speculative_config_text(spec: dict[str, Any]) -> str:
    """``speculative_config.json`` as written into the repo."""
    return json.dumps(spec, indent=2) + "\n"


def vllm_serve_command(target: str, spec: dict[str, Any]) -> str:
    """``vllm serve TARGET --speculative-config '{...}'`` (shell-quoted; the JSON is exactly ``spec``)."""
    return f"vllm serve {shlex.quote(target)} --speculative-config {shlex.quote(json.dumps(spec))}"


def vllm_python_snippet(target: str, spec: dict[str, Any]) -> str:
    return (
        "from vllm import LLM, SamplingParams\n\n"
        "llm = LLM(\n"
        f"    model={json.dumps(target)},\n"
        f"    speculative_config={json.dumps(spec)},\n"
        ")\n"
        "messages = [{\"role\": \"user\", \"content\": \"Write a haiku about speculative decoding.\"}]\n"
        "out = llm.chat(messages, SamplingParams(temperature=0.0, max_tokens=256))\n"
        "print(out[0].outputs[0].text)\n"
    )


def sglang_args(draft: str, num_steps: int) -> list[str]:
    """SGLang launch arguments for a chain (top-k 1) of ``num_steps`` drafts: num_draft_tokens = steps + 1."""
    return [
        "--speculative-algorithm", "EAGLE3",
        "--speculative-draft-model-path", draft,
        "--speculative-num-steps", str(num_steps),
        "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", str(num_steps + 1),
    ]


def sglang_command(target: str, draft: str, num_steps: int) -> str:
    args = ["python", "-m", "sglang.launch_server", "--model-path", target, *sglang_args(draft, num_steps)]
    return " ".join(shlex.quote(a) for a in args)
