"""Streaming target statistics and the precomputed hidden-state layouts."""

from __future__ import annotations

import json

import pytest
import torch

from eagle_migrate.errors import DataError
from eagle_migrate.hidden_states import HiddenRecord, count_hidden_states, iter_hidden_states, write_hidden_states
from eagle_migrate.stats import StatsAccumulator

K, HT = 3, 16
IDS = [2, 5, 7]


def synthetic(n: int = 6, t: int = 20, seed: int = 0, first_spike: float = 1000.0) -> list[torch.Tensor]:
    """Aux states whose per-token RMS varies (log-normal) around layer scales 2, 5, 20, with a huge position 0."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        chunks = []
        for s in (2.0, 5.0, 20.0):
            x = torch.randn(t, HT, generator=g)
            x = x / x.pow(2).mean(-1, keepdim=True).sqrt()
            r = s * torch.exp(0.2 * torch.randn(t, 1, generator=g))
            chunks.append(x * r)
        a = torch.cat(chunks, -1)
        a[0] *= first_spike
        out.append(a)
    return out


def test_streaming_equals_batch_and_excludes_position_zero():
    seqs = synthetic()
    acc = StatsAccumulator(IDS, HT, eps=0.0)
    for a in seqs:
        acc.update(a)
    st = acc.statistics()
    allx = torch.cat([a[1:] for a in seqs])
    assert st.num_tokens == allx.shape[0] and st.num_sequences == len(seqs)
    for k, ls in enumerate(st.layers):
        r = allx[:, k * HT:(k + 1) * HT].pow(2).mean(-1).sqrt()
        assert ls.layer_id == IDS[k]
        assert ls.rms_mean == pytest.approx(float(r.mean()), rel=1e-5)
        assert ls.rms_median == pytest.approx(float(r.median()), rel=1e-5)
        assert ls.rms_first_position > 100 * ls.rms_median  # recorded, but kept out of the estimate
        ch = allx[:, k * HT:(k + 1) * HT].pow(2).mean(0).sqrt()
        assert ls.channel_rms_max == pytest.approx(float(ch.max()), rel=1e-4)


def test_fits_recover_constant_scales_exactly():
    """With a constant RMS per layer every fit equals that RMS (the toy world's situation)."""
    g = torch.Generator().manual_seed(1)
    fc = torch.randn(8, K * HT, generator=g)
    acc = StatsAccumulator(IDS, HT, eps=0.0, fc_weight=fc)
    for _ in range(4):
        chunks = []
        for s in (2.0, 5.0, 20.0):
            x = torch.randn(12, HT, generator=g)
            chunks.append(s * x / x.pow(2).mean(-1, keepdim=True).sqrt())
        acc.update(torch.cat(chunks, -1))
    fits = acc.fits()
    for name in ("mean-rms", "median-rms", "lstsq-scalar", "lstsq-channel", "lstsq-channel-independent",
                 "lstsq-scalar-relative", "lstsq-channel-relative"):
        w = fits.candidates[name]
        for k, s in enumerate((2.0, 5.0, 20.0)):
            assert torch.allclose(w[k], torch.full((HT,), s), rtol=1e-3), name


def test_fc_space_least_squares_beats_ones_and_is_near_mean_rms():
    seqs = synthetic(n=8, t=40)
    g = torch.Generator().manual_seed(3)
    fc = torch.randn(8, K * HT, generator=g)
    acc = StatsAccumulator(IDS, HT, eps=0.0, fc_weight=fc)
    for a in seqs:
        acc.update(a)
    fits = acc.fits()
    held = synthetic(n=4, t=40, seed=9)

    def err(ws):
        w = torch.cat(ws)
        num = den = 0.0
        for a in held:
            a = a[1:]
            u, s, _ = acc.split(a)
            src = a @ fc.T
            num += float((((u * w) @ fc.T) - src).pow(2).sum())
            den += float(src.pow(2).sum())
        return num / den

    e = {n: err(w) for n, w in fits.candidates.items()}
    assert e["lstsq-scalar"] <= e["mean-rms"] * 1.05
    assert e["mean-rms"] < 0.2 * e["ones"]  # the scale ratio between layers is what matters


def test_relative_fit_is_not_dominated_by_large_tokens():
    """A few tokens with a 30x larger fc output decide the plain least-squares scalars; the relative fit follows the
    typical token, so its mean relative error over tokens is lower (what matters once hidden_norm drops the scale)."""
    g = torch.Generator().manual_seed(5)
    fc = torch.randn(8, K * HT, generator=g)
    acc = StatsAccumulator(IDS, HT, eps=0.0, fc_weight=fc)
    toks = []
    for i in range(6):
        chunks = []
        for k, s in enumerate((2.0, 5.0, 20.0)):
            x = torch.randn(16, HT, generator=g)
            scale = s * (1.0 + 0.3 * torch.rand(16, 1, generator=g))
            if i == 0 and k == 0:
                scale[1:3] *= 30.0  # two outlier tokens in layer 0 only
            chunks.append(scale * x / x.pow(2).mean(-1, keepdim=True).sqrt())
        a = torch.cat(chunks, -1)
        acc.update(a)
        toks.append(a[1:])
    fits = acc.fits()
    allx = torch.cat(toks)

    def mean_rel_err(ws):
        w = torch.cat(ws)
        h = allx.view(-1, K, HT)
        u = (h / h.pow(2).mean(-1, keepdim=True).sqrt()).view(-1, K * HT)
        z, zc = allx @ fc.T, (u * w) @ fc.T
        return float(((zc - z).norm(dim=-1) / z.norm(dim=-1)).mean())

    plain, rel = fits.candidates["lstsq-scalar"], fits.candidates["lstsq-scalar-relative"]
    assert float(plain[0][0]) > 1.3 * float(rel[0][0])  # pulled up by the outliers
    assert mean_rel_err(rel) < mean_rel_err(plain)
    assert "lstsq-channel-relative" in fits.candidates


def test_norm_before_fc_scales_are_relative():
    seqs = synthetic(first_spike=1.0)
    acc = StatsAccumulator(IDS, HT, eps=0.0, norm_before_fc=True)
    for a in seqs:
        acc.update(a)
    st = acc.statistics()
    assert st.norm_before_fc_source
    # a_k = rms(h_k) / rms(cat): the largest layer dominates the concat, so its relative scale is close to sqrt(3)
    assert st.layers[2].scale_mean == pytest.approx(3 ** 0.5, rel=0.1)
    assert st.layers[0].scale_mean < st.layers[1].scale_mean < st.layers[2].scale_mean


def test_width_mismatch_is_a_data_error():
    acc = StatsAccumulator(IDS, HT, eps=0.0)
    with pytest.raises(DataError, match="48"):
        acc.update(torch.zeros(4, 2 * HT))


# ----- precomputed layouts ----------------------------------------------------------------------------------------
def _recs(n=5):
    seqs = synthetic(n=n, t=10)
    return [HiddenRecord(torch.arange(10 + i)[:10], a, torch.randn(10, HT)) for i, a in enumerate(seqs)]


def test_own_layout_roundtrip_batched_and_padded(tmp_path):
    recs = _recs()
    recs[1] = HiddenRecord(recs[1].input_ids[:7], recs[1].aux[:7], recs[1].last[:7])  # shorter row -> padding
    write_hidden_states(tmp_path / "hs", recs, IDS, batch=2)
    assert count_hidden_states(tmp_path / "hs") == 5
    back = list(iter_hidden_states(tmp_path / "hs", IDS, HT))
    assert len(back) == 5 and back[1].aux.shape == (7, K * HT)
    for a, b in zip(recs, back):
        assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.aux, b.aux) and torch.equal(a.last, b.last)
    with pytest.raises(DataError, match=r"\[1, 2, 3\]"):
        list(iter_hidden_states(tmp_path / "hs", [1, 2, 3], HT))
    with pytest.raises(DataError, match="wide"):
        list(iter_hidden_states(tmp_path / "hs", IDS, HT + 1))


def test_train_feature_cache_is_read(tmp_path):
    """The files eagle_migrate.features.FeatureStore caches are our layout too."""
    from safetensors.torch import save_file

    ids = torch.randint(0, 50, (2, 9))
    save_file({"input_ids": ids, "lengths": torch.tensor([9, 6]), "loss_mask": torch.ones(2, 9, dtype=torch.uint8),
               "aux": torch.randn(2, 9, K * HT), "final": torch.randn(2, 9, HT)}, str(tmp_path / "batch-00000.safetensors"),
              metadata={"layer_ids": json.dumps(IDS)})
    back = list(iter_hidden_states(tmp_path, IDS, HT))
    assert [b.input_ids.numel() for b in back] == [9, 6] and back[1].last.shape == (6, HT)


def test_speculators_layout(tmp_path):
    """speculators data_generation_offline: data_N.pt with a list of per-layer states ([aux..., L-1])."""
    for i in range(3):
        hs = [torch.randn(8, HT) for _ in range(4)]
        torch.save({"input_ids": torch.arange(8), "hidden_states": hs, "loss_mask": torch.ones(8)}, tmp_path / f"data_{i}.pt")
    (tmp_path / "data_config.json").write_text(json.dumps({"version": "1", "hidden_states": {"layer_ids": [2, 5, 7, 9]}}))
    back = list(iter_hidden_states(tmp_path, IDS, HT))
    assert len(back) == 3 and back[0].aux.shape == (8, K * HT) and back[0].last is None
    d = torch.load(tmp_path / "data_0.pt", weights_only=True)
    assert torch.equal(back[0].aux, torch.cat(d["hidden_states"][:3], -1))
    with pytest.raises(DataError, match="needs"):
        list(iter_hidden_states(tmp_path, [1, 5, 7], HT))


def test_specforge_layout(tmp_path):
    """SpecForge offline data: rows_*/data_N.ckpt with aux_hidden_state [1,T,K*Ht] and post-norm hidden_state."""
    (tmp_path / "rows_0-2").mkdir()
    for i in range(2):
        torch.save({"input_ids": torch.arange(6), "loss_mask": torch.ones(6), "aux_hidden_state": torch.randn(1, 6, K * HT),
                    "hidden_state": torch.randn(1, 6, HT)}, tmp_path / "rows_0-2" / f"data_{i}.ckpt")
    back = list(iter_hidden_states(tmp_path, IDS, HT))
    assert len(back) == 2 and back[0].aux.shape == (6, K * HT) and back[0].last.shape == (6, HT)


def test_unknown_folder_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="no hidden states"):
        list(iter_hidden_states(tmp_path, IDS, HT))
