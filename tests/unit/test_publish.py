"""publish: the repo folder, the validation gate, dry-run without network, and the real upload path against the
local test hub (tests/hubserver.py) with a fake token that must never show up anywhere."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from eagle_migrate import __version__, toy
from eagle_migrate.errors import CheckFailed, CheckpointError, InputError, OutputExistsError
from eagle_migrate.formats.io import sha256_files, weight_files
from eagle_migrate.publish import load_report, publish, scrub

from ..hubserver import serve

REPO = Path(__file__).resolve().parents[2]
TOKEN = "hf_TESTTOKENdoNotLeak0123456789abcdef"


def tree_digest(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def write_report(folder: Path, **over) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rep = {
        "passed": True, "engine": "vllm", "vllm_version": "0.32.0", "num_speculative_tokens": 3, "temperature": 0.0,
        "suites": {"chat": {"acceptance_length": 4.0, "baseline_acceptance_length": 2.0, "per_position_rate": [1.0, 1.0, 1.0]}},
        "gates": [{"name": "min_acceptance_length", "passed": True, "value": 4.0, "threshold": 2.0}],
    }
    rep.update(over)
    (folder / "report.json").write_text(json.dumps(rep))
    return folder


def write_eagle31(out: Path, provenance: dict | None = None) -> Path:
    """A toy EAGLE-3.1 drafter (fc_norm + norm_output with its fc_norm weights) in the vLLM layout."""
    from eagle_migrate.formats.write import write_vllm

    out.mkdir(parents=True, exist_ok=True)
    cfg = toy.drafter_config(fc_norm=True, norm_output=True)
    sd = toy.drafter_state_dict("oracle")
    for k, i in enumerate(toy.AUX_IDS):
        sd[f"fc_norm.{k}.weight"] = torch.full((toy.H,), toy.aux_rms(i))
    write_vllm(cfg, sd, out, dtype=torch.float32)
    if provenance is not None:
        (out / "provenance.json").write_text(json.dumps(provenance))
    return out


@pytest.fixture
def no_network(monkeypatch):
    """Any socket connection fails the test."""
    def refuse(*a, **k):
        raise AssertionError(f"network used: {a}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


# ----- building the folder ----------------------------------------------------------------------------------------
def test_dry_run_writes_the_repo_folder_without_network(toy_oracle, tmp_path, no_network):
    before = tree_digest(toy_oracle)
    rep = write_report(tmp_path / "rep")
    (rep / "acceptance.png").write_bytes(b"\x89PNG\r\n\x1a\nfake")
    res = publish(toy_oracle, "my-org/toy-eagle3", report_dir=rep, dry_run=True, out_dir=tmp_path / "out",
                  target="meta-llama/Llama-3.1-8B-Instruct")
    out = tmp_path / "out"
    assert res.dry_run and res.commit_url is None and res.out_dir == str(out)
    names = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert names == sorted(f.path for f in res.files) == [
        "README.md", "config.json", "model.safetensors", "provenance.json", "speculative_config.json",
        "validation/acceptance.png", "validation/report.json",
    ]
    assert res.total_bytes == sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    # weights and config byte for byte; the input untouched
    assert (out / "model.safetensors").read_bytes() == (toy_oracle / "model.safetensors").read_bytes()
    assert (out / "config.json").read_bytes() == (toy_oracle / "config.json").read_bytes()
    assert tree_digest(toy_oracle) == before
    spec = json.loads((out / "speculative_config.json").read_text())
    assert spec == {"model": "my-org/toy-eagle3", "method": "eagle3", "num_speculative_tokens": 3} == res.speculative_config
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["publish"]["weights_sha256"] == sha256_files(weight_files(toy_oracle))
    assert prov["publish"]["validation"] == {"measured": True, "gates": 1, "passed": True, "forced": False,
                                             "forced_by": None, "reason": None}
    assert res.commit_message == f"Upload EAGLE-3 drafter for meta-llama/Llama-3.1-8B-Instruct (eagle-migrate {__version__})"
    assert res.vllm_serve.startswith("vllm serve meta-llama/Llama-3.1-8B-Instruct --speculative-config '{")
    assert res.sglang_args[-2:] == ["--speculative-num-draft-tokens", "4"]


def test_model_card_front_matter(tmp_path):
    from huggingface_hub import ModelCard

    ck = write_eagle31(tmp_path / "ck", {"target": {"name_or_path": "meta-llama/Llama-3.1-8B-Instruct"}, "license": "llama3.1"})
    publish(ck, "o/n", report_dir=write_report(tmp_path / "rep"), dry_run=True, out_dir=tmp_path / "out")
    card = ModelCard.load(tmp_path / "out" / "README.md")
    assert card.data.base_model == "meta-llama/Llama-3.1-8B-Instruct"
    assert card.data.library_name == "vllm"
    assert card.data.license == "llama3.1"
    assert {"speculative-decoding", "eagle3", "eagle3.1"} <= set(card.data.tags)
    text = card.text
    assert "EAGLE-3.1" in text and "| chat | 4.000 | 2.000 |" in text and "--speculative-eagle-topk 1" in text


def test_eagle3_card_has_no_eagle31_tag_and_no_base_model_when_unknown(toy_oracle, tmp_path):
    from huggingface_hub import ModelCard

    res = publish(toy_oracle, "o/n", report_dir=write_report(tmp_path / "rep"), dry_run=True, out_dir=tmp_path / "out")
    card = ModelCard.load(tmp_path / "out" / "README.md")
    assert "eagle3.1" not in card.data.tags and card.data.base_model is None
    assert "base_model_unknown" in {f.code for f in res.findings}
    assert "TARGET_MODEL" in res.vllm_serve


def test_license_from_a_local_target_card(tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    (target / "README.md").write_text("---\nlicense: other\nlicense_name: my-license\nlicense_link: LICENSE\n---\n# t\n")
    ck = write_eagle31(tmp_path / "ck", {"target": str(target)})
    res = publish(ck, "o/n", report_dir=write_report(tmp_path / "rep"), dry_run=True, out_dir=tmp_path / "out",
                  target="org/target")
    assert res.license == "other" and res.base_model == "org/target"
    assert "license_name: my-license" in (tmp_path / "out" / "README.md").read_text()


def test_out_folder_rules(toy_oracle, tmp_path):
    rep = write_report(tmp_path / "rep")
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("x")
    with pytest.raises(OutputExistsError):
        publish(toy_oracle, "o/n", report_dir=rep, dry_run=True, out_dir=other)
    assert (other / "keep.txt").exists()
    publish(toy_oracle, "o/n", report_dir=rep, dry_run=True, out_dir=tmp_path / "out")
    res = publish(toy_oracle, "o/n", report_dir=rep, dry_run=True, out_dir=tmp_path / "out", num_speculative_tokens=5)
    assert json.loads((tmp_path / "out" / "speculative_config.json").read_text())["num_speculative_tokens"] == 5 == res.num_speculative_tokens
    with pytest.raises(InputError):  # never inside the input checkpoint
        publish(toy_oracle, "o/n", report_dir=rep, dry_run=True, out_dir=toy_oracle / "pub")


@pytest.mark.parametrize("repo_id", ["noslash", "a/b/c", "/x", "o/", "o/n n"])
def test_bad_repo_id(toy_oracle, tmp_path, repo_id):
    with pytest.raises(InputError):
        publish(toy_oracle, repo_id, dry_run=True, force=True, out_dir=tmp_path / "out")


def test_refuses_bin_weights_and_missing_config(tmp_path):
    ck = tmp_path / "ck"
    ck.mkdir()
    torch.save({"fc.weight": torch.zeros(2, 2)}, ck / "pytorch_model.bin")
    with pytest.raises(CheckpointError):
        publish(ck, "o/n", dry_run=True, force=True, out_dir=tmp_path / "o1")
    (ck / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match="safetensors"):
        publish(ck, "o/n", dry_run=True, force=True, out_dir=tmp_path / "o2")


# ----- the validation gate -------------------------------------------------------------------------------------------
def test_refuses_without_a_report_unless_forced(toy_oracle, tmp_path):
    with pytest.raises(InputError, match="no validation report") as ei:
        publish(toy_oracle, "o/n", dry_run=True, out_dir=tmp_path / "out")
    assert ei.value.exit_code == 2 and "--force" in ei.value.hint
    assert not (tmp_path / "out").exists()
    res = publish(toy_oracle, "o/n", dry_run=True, out_dir=tmp_path / "out", force=True)
    assert res.validation.forced and res.validation.passed is None
    assert "published with `--force`" in (tmp_path / "out" / "README.md").read_text()


@pytest.mark.parametrize("report,why,code", [
    ({"passed": False}, "did not pass", 1),
    ({"passed": None, "gates": [{"name": "min_al", "passed": False}]}, "min_al", 1),
    ({"passed": True, "gates": {"max_regression": {"status": "fail", "message": "AL -12%"}}}, "max_regression", 1),
    ({"passed": None, "gates": None}, "no verdict", 2),
    ({"drafter_sha256": "0" * 64}, "other weights", 2),
])
def test_refuses_a_report_that_does_not_pass(toy_oracle, tmp_path, report, why, code):
    """One rule for the exit code: a gate that ran and failed is exit 1 (CheckFailed); a report that cannot show
    these weights pass (no verdict, other weights; like no report at all) is bad input, exit 2."""
    rep = write_report(tmp_path / "rep", **report)
    with pytest.raises(CheckFailed if code == 1 else InputError, match=why) as ei:
        publish(toy_oracle, "o/n", report_dir=rep, dry_run=True, out_dir=tmp_path / "out")
    assert ei.value.exit_code == code and not isinstance(ei.value, CheckFailed if code == 2 else InputError)
    assert not (tmp_path / "out").exists()
    res = publish(toy_oracle, "o/n", report_dir=rep, dry_run=True, out_dir=tmp_path / "out", force=True)
    assert res.validation.forced and why in res.validation.reason and res.validation.forced_by == "--force"


def test_gates_alone_can_pass(toy_oracle, tmp_path):
    rep = write_report(tmp_path / "rep", passed=None, gates={"min_al": True, "max_regression": {"ok": True}})
    assert publish(toy_oracle, "o/n", report_dir=rep, dry_run=True, out_dir=tmp_path / "out").validation.passed


def test_refuses_a_report_for_other_weights(toy_oracle, tmp_path):
    rep = write_report(tmp_path / "rep", drafter_sha256="0" * 64)
    with pytest.raises(InputError, match="other weights") as ei:  # a refused input: exit 2, as a missing report
        publish(toy_oracle, "o/n", report_dir=rep, dry_run=True, out_dir=tmp_path / "out")
    assert ei.value.exit_code == 2
    rep = write_report(tmp_path / "rep2", drafter={"sha256": sha256_files(weight_files(toy_oracle))})
    assert publish(toy_oracle, "o/n", report_dir=rep, dry_run=True, out_dir=tmp_path / "out").validation.passed


def test_malformed_reports_are_input_errors(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "report.json").write_text("{nope")
    with pytest.raises(InputError, match="not valid JSON"):
        load_report(tmp_path / "a")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "report.json").write_text("[1, 2]")
    with pytest.raises(InputError, match="JSON object"):
        load_report(tmp_path / "b")
    with pytest.raises(InputError, match="no report.json"):
        load_report(tmp_path / "c")
    # odd shapes are tolerated: the table is built from whatever suites look like
    rep = write_report(tmp_path / "d", suites=[{"suite": "x", "drafter": {"acceptance_length": 2.5}, "outputs": [[1]]}, 7], gates=["?"])
    r = load_report(rep)
    assert r.info.columns == ["suite", "drafter AL"] and r.info.rows == [["x", "2.500"]]


def test_scrub():
    assert scrub(f"bad {TOKEN} here", TOKEN) == "bad *** here"
    assert scrub("Authorization: Bearer hf_abcdefghijklmnop", None) == "Authorization: Bearer hf_***"


# ----- the upload path against the local hub ---------------------------------------------------------------------
def run_cli(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE"))}
    e.update(env)
    e["PYTHONPATH"] = str(REPO) + os.pathsep + e.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "eagle_migrate", "publish", *args], capture_output=True, text=True,
                          env=e, cwd=cwd, timeout=180)


def hub_env(hub, home: Path, token: str | None = TOKEN) -> dict[str, str]:
    env = {"HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_XET": "1", "HF_HUB_OFFLINE": "0", "HF_HOME": str(home),
           "HF_HUB_DISABLE_TELEMETRY": "1"}
    if token:
        env["HF_TOKEN"] = token
    return env


def assert_no_token_anywhere(token: str, *texts: str, folders: list[Path] = ()) -> None:
    for t in texts:
        assert token not in t
    for folder in folders:
        for p in folder.rglob("*"):
            if p.is_file():
                assert token.encode() not in p.read_bytes(), p


def test_upload_create_pr_through_the_local_hub(toy_oracle, tmp_path):
    rep = write_report(tmp_path / "rep")
    (rep / "acceptance.png").write_bytes(b"\x89PNG\r\n\x1a\nfake")
    with serve(token=TOKEN, lifetime=120) as hub:
        r = run_cli([str(toy_oracle), "--repo-id", "my-org/toy-eagle3", "--report", str(rep), "--create-pr",
                     "--private", "--target", "meta-llama/Llama-3.1-8B-Instruct", "--json"],
                    hub_env(hub, tmp_path / "home"), tmp_path)
        assert r.returncode == 0, r.stderr
        res = json.loads(r.stdout)
        assert len(hub.state.commits) == 1
        c = hub.state.commits[0]
        repo = hub.state.repos["my-org/toy-eagle3"]
        unhandled = list(hub.state.unhandled)
    assert unhandled == []
    assert repo.private is True
    assert c["create_pr"] is True and c["revision"] == "main" and c["branch"] == "refs/pr/1"
    assert res["pr_url"].endswith("/my-org/toy-eagle3/discussions/1") and res["commit_oid"] == c["oid"]
    assert c["summary"] == f"Upload EAGLE-3 drafter for meta-llama/Llama-3.1-8B-Instruct (eagle-migrate {__version__})"
    assert __version__ in c["summary"] and "Validation: passed" in c["description"]
    assert sorted(c["files"]) == ["README.md", "config.json", "model.safetensors", "provenance.json",
                                  "speculative_config.json", "validation/acceptance.png", "validation/report.json"]
    assert c["files"]["model.safetensors"]["lfs"] is True  # through the LFS batch + PUT path
    assert c["files"]["model.safetensors"]["content"] == (toy_oracle / "model.safetensors").read_bytes()
    assert c["files"]["config.json"]["content"] == (toy_oracle / "config.json").read_bytes()
    assert json.loads(c["files"]["speculative_config.json"]["content"]) == {
        "model": "my-org/toy-eagle3", "method": "eagle3", "num_speculative_tokens": 3}
    assert b"base_model: meta-llama/Llama-3.1-8B-Instruct" in c["files"]["README.md"]["content"]
    assert res["out_dir"] is None  # a temporary folder, removed
    assert_no_token_anywhere(TOKEN, r.stdout, r.stderr, *(f["content"].decode("latin-1") for f in c["files"].values()),
                             folders=[tmp_path])


def test_upload_to_a_branch_twice_with_out_dir(toy_oracle, tmp_path):
    rep = write_report(tmp_path / "rep")
    with serve(token=TOKEN, lifetime=120) as hub:
        env = hub_env(hub, tmp_path / "home")
        args = [str(toy_oracle), "--repo-id", "my-org/x", "--report", str(rep), "--revision", "v2", "--out", str(tmp_path / "pub")]
        r1 = run_cli(args, env, tmp_path)
        r2 = run_cli(args, env, tmp_path)  # repo and branch exist now: exist_ok paths
        commits = list(hub.state.commits)
        repo = hub.state.repos["my-org/x"]
    assert r1.returncode == 0 and r2.returncode == 0, r1.stderr + r2.stderr
    assert [c["revision"] for c in commits] == ["v2", "v2"] and not any(c["create_pr"] for c in commits)
    assert repo.private is False and "v2" in repo.branches and repo.branches["main"] == {}
    assert "published to my-org/x" in r2.stdout and "branch v2" in r2.stdout
    assert (tmp_path / "pub" / "README.md").is_file()
    assert_no_token_anywhere(TOKEN, r1.stdout, r1.stderr, r2.stdout, r2.stderr, folders=[tmp_path])


def test_upload_errors_are_one_line_and_scrubbed(toy_oracle, tmp_path):
    rep = write_report(tmp_path / "rep")
    with serve(token="hf_theRealTokenTheHubWants000", lifetime=120) as hub:
        bad = run_cli([str(toy_oracle), "--repo-id", "o/n", "--report", str(rep)], hub_env(hub, tmp_path / "h1"), tmp_path)
        none = run_cli([str(toy_oracle), "--repo-id", "o/n", "--report", str(rep)], hub_env(hub, tmp_path / "h2", token=None), tmp_path)
        assert hub.state.commits == []
    assert bad.returncode == 2 and "refused the token (HTTP 401)" in bad.stderr and "Traceback" not in bad.stderr
    assert none.returncode == 2 and "no Hugging Face token" in none.stderr
    with socket.socket() as s:  # a port nothing listens on: the Hub is unreachable
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    down = run_cli([str(toy_oracle), "--repo-id", "o/n", "--report", str(rep)],
                   {**hub_env(hub, tmp_path / "h3"), "HF_ENDPOINT": f"http://127.0.0.1:{port}"}, tmp_path)
    assert down.returncode == 1 and "create_repo o/n" in down.stderr and "Traceback" not in down.stderr
    assert_no_token_anywhere(TOKEN, bad.stdout, bad.stderr, down.stdout, down.stderr, folders=[tmp_path])


def test_offline_mode_and_dry_run_need_no_token(toy_oracle, tmp_path):
    rep = write_report(tmp_path / "rep")
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "home"), "HF_ENDPOINT": "http://127.0.0.1:9"}
    r = run_cli([str(toy_oracle), "--repo-id", "o/n", "--report", str(rep)], env, tmp_path)
    assert r.returncode == 2 and "HF_HUB_OFFLINE" in r.stderr
    before = sorted(p.name for p in tmp_path.iterdir())
    r = run_cli([str(toy_oracle), "--repo-id", "o/n", "--report", str(rep), "--dry-run", "--json"], env, tmp_path)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    # a dry run without --out writes nothing (no folder in the current directory): the plan is all it returns
    assert plan["dry_run"] and plan["out_dir"] is None and "README.md" in {f["path"] for f in plan["files"]}
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    r = run_cli([str(toy_oracle), "--repo-id", "o/n", "--report", str(rep), "--dry-run", "--out", "pub"], env, tmp_path)
    assert r.returncode == 0 and (tmp_path / "pub" / "speculative_config.json").is_file()


def test_publish_help():
    r = subprocess.run([sys.executable, "-m", "eagle_migrate", "publish", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0
    for opt in ("--repo-id", "--report", "--private", "--create-pr", "--revision", "--dry-run", "--out", "--force", "--json"):
        assert opt in r.stdout


def test_target_from_a_quantize_style_provenance(tmp_path):
    ck = write_eagle31(tmp_path / "ck", {"source": {"path": "/x/convert", "format": "eagle3.1"},
                                          "options": {"scheme": "fp8-dynamic", "target": "Qwen/Qwen3-8B"}})
    res = publish(ck, "o/n", report_dir=write_report(tmp_path / "rep"), dry_run=True, out_dir=tmp_path / "out")
    assert res.base_model == "Qwen/Qwen3-8B" and res.format == "eagle3.1"
    with pytest.raises(InputError, match="neither a hub model id"):
        publish(ck, "o/n", report_dir=write_report(tmp_path / "rep"), dry_run=True, out_dir=tmp_path / "out", target="./local")


def test_refuses_eagle2_drafters(tmp_path):
    from tests.layouts import write_layout

    ck = write_layout("vllm-v0-eagle", toy.drafter_config(), toy.drafter_state_dict("oracle"), tmp_path / "e2")
    with pytest.raises(CheckpointError, match="EAGLE-3"):
        publish(ck, "o/n", dry_run=True, force=True, out_dir=tmp_path / "out")


def test_a_drafter_inspect_refuses_is_bad_input_and_a_failed_gate_is_exit_1(tmp_path):
    """The same kind of refusal gets the same exit code: a refused input (the drafter has inspect errors, no report,
    a report of other weights) is 2; only a report whose gates failed is 1."""
    from tests.layouts import write_layout
    from tests.unit.test_convert import toy_cfg, toy_layout_sd

    bad = write_layout("specforge", toy_cfg(), toy_layout_sd(), tmp_path / "sf")  # d2t with Vd = V: an inspect error
    with pytest.raises(CheckpointError, match="inspect` finds errors") as ei:
        publish(bad, "o/n", dry_run=True, out_dir=tmp_path / "out")
    assert ei.value.exit_code == 2 and not (tmp_path / "out").exists()
