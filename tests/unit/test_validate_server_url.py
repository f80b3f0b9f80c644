"""`validate --server URL` with nothing else: the suites tokenised through the server (ServerTokenizer over a fake
/tokenize and /detokenize backed by a real transformers tokenizer, tests/toy_chat.py's), the drafter's aux ids,
flags and hashes recorded from a folder or named unknown, and the CLI's refusal without --server. The real server:
tests/integration/test_watch_vllm.py."""

from __future__ import annotations

import hashlib

import pytest

from eagle_migrate import corpora, toy
from eagle_migrate.errors import EngineError, InputError, ServerError
from eagle_migrate.engines.server_tokenizer import DRAFTER_FIELDS, ServedModel, ServerTokenizer, drafter_record

from ..toy_chat import write_tokenizer


class FakeServerClient:
    """/tokenize and /detokenize as vLLM answers them, from a local tokenizer; counts the calls."""

    url = "http://fake/v1"

    def __init__(self, tok, fail: bool = False):
        self.tok, self.fail, self.calls = tok, fail, 0

    def tokenize_text(self, text, add_special_tokens=False):
        self.calls += 1
        if self.fail:
            raise EngineError("http://fake/v1: HTTP 400 on POST /tokenize: tokenizer not initialized")
        return list(self.tok(text, add_special_tokens=add_special_tokens)["input_ids"])

    def tokenize_messages(self, messages, add_generation_prompt=True):
        self.calls += 1
        out = self.tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True)
        return list(out["input_ids"] if hasattr(out, "keys") else out)

    def detokenize(self, ids):
        self.calls += 1
        return self.tok.decode(ids)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(write_tokenizer(tmp_path_factory.mktemp("tok")))


def test_suites_through_the_server_equal_the_targets_own(tokenizer):
    """Every suite built through /tokenize gives the token ids the target's own tokenizer gives: the same prompt-set
    hashes as an in-process validation, so the two reports compare."""
    client = FakeServerClient(tokenizer)
    st = ServerTokenizer(client)
    assert st.bos_token_id is None  # this tokenizer adds no BOS to plain text (its chat template does)
    info = ServedModel(1024)
    for name in ("chat", "code", "template-shift", "long"):
        kw = dict(num_prompts=2, max_tokens=16, max_model_len=1024, seed=0, fetch=False, long_buckets=(256, 512))
        ours = corpora.suite(name, st, info, **kw)
        theirs = corpora.suite(name, tokenizer, info, **kw)
        assert ours.prompts == theirs.prompts and ours.hash == theirs.hash, name
    assert client.calls > 0
    conv = corpora.load_conversations(None)[0]
    ids = corpora.render(conv, st)
    assert ids == client.tokenize_messages(conv.prompt_messages()) and ids[:2] == [0, 1]  # the server's template


def test_a_server_without_a_tokenizer_is_one_line(tokenizer):
    with pytest.raises(ServerError, match="cannot tokenise") as e:
        ServerTokenizer(FakeServerClient(tokenizer, fail=True))
    assert "--target" in e.value.hint


def test_drafter_record_from_a_folder_or_unknown(tmp_path):
    none = drafter_record(None, None)
    assert none["unknown"] == list(DRAFTER_FIELDS) and all(none[k] is None for k in DRAFTER_FIELDS)
    assert "pass the drafter folder" in none["note"]
    named = drafter_record("org/remote-drafter", "org/remote-drafter")  # a Hub id is not read: still unknown
    assert named["served_as"] == "org/remote-drafter" and named["unknown"] == list(DRAFTER_FIELDS)
    d = toy.write_drift_drafter(tmp_path / "d")
    rec = drafter_record(d, None)
    assert rec["unknown"] == [] and rec["aux_layer_ids"] == toy.AUX_IDS and rec["flags"] == []
    assert rec["config_sha256"] == hashlib.sha256((d / "config.json").read_bytes()).hexdigest()
    from eagle_migrate.formats.io import open_checkpoint_path, sha256_files

    assert rec["weights_sha256"] == sha256_files(open_checkpoint_path(d)[1])


def test_cli_validate_needs_ckpt_and_target_without_server(capsys, tmp_path):
    from eagle_migrate.cli import main

    with pytest.raises(SystemExit) as e:
        main(["validate", "--target", str(tmp_path)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "validate needs CKPT and --target" in err and "--server URL" in err
    assert InputError in type(ServerError("x")).__mro__  # the one table: exit 2
