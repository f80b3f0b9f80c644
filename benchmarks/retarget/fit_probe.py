"""A probe of another fit measure (issue 50): on B's own text, where A's and B's greedy next tokens differ, does the
drafter's step 0 propose A's token (it drafts what A would write: stale) or B's? target_fit.py's step-0 agreement on
B's text against A's text mixes in how predictable each text is; this compares the two targets on the same positions.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/retarget/fit_probe.py DRAFTER B A [N_SEQUENCES]

Prints one JSON line: the drafted positions of B's own sequences (own_text.measurement_sequences, as target_fit), those
where A's greedy token differs from B's, and the drafter's top-1 hits on B's and on A's token, overall and there.
"""
import sys, json, torch
from eagle_migrate.aux_evidence import Step0, target_states
from eagle_migrate.formats import read_checkpoint
from eagle_migrate.loader import load_drafter
from eagle_migrate.own_text import drafted_positions, measurement_sequences
from eagle_migrate.target import LazyTarget

src, B, A = sys.argv[1:4]
n_seq = int(sys.argv[4]) if len(sys.argv) > 4 else 16
ck = read_checkpoint(src)
ids = list(ck.config.aux_layer_ids)
tb = LazyTarget(B, "cpu", torch.float32); ta = LazyTarget(A, "cpu", torch.float32)
m = load_drafter(ck, tb.loaded, device="cpu", dtype=torch.float32)
step = Step0(m, tb.info.vocab_size, "cpu", torch.float32)
rows = []
for i, h in enumerate(measurement_sequences(tb, None, 0, None, 512)):
    sb, nb = target_states(tb, h.ids, ids)
    _, na = target_states(ta, h.ids, ids)
    aux = torch.cat([sb[j] for j in sorted(ids)], dim=-1)[: len(h.ids) - 1]
    prop = step.top1(aux, h.ids)  # [T-1]
    drafted = drafted_positions(h, nb)
    wb, wa = nb[1:][: len(prop)], na[1:][: len(prop)]
    # position i proposes the token after ids[i+1]: compare with the targets' greedy next token there
    d = drafted[: len(prop)]
    diff = d & (wa != wb)
    rows.append({"drafted": int(d.sum()), "differ": int(diff.sum()), "hit_B": int((prop == wb)[d].sum()),
                 "hit_A": int((prop == wa)[d].sum()), "on_diff_B": int((prop == wb)[diff].sum()),
                 "on_diff_A": int((prop == wa)[diff].sum())})
    if len(rows) >= n_seq:
        break
tot = {k: sum(r[k] for r in rows) for k in rows[0]}
print(json.dumps({"sequences": len(rows), **tot}))
