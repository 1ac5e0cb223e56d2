"""Compare determinism_probe.py outputs: python determinism_compare.py A.pt B.pt [runA runB]

Prints device/digest/schedule agreement, then for each engine step the
max |logit difference| per row, the first step where logits differ, and the
top-1/top-2 gap of A at the first token divergence (tie or not).
"""

import sys

import torch


def main() -> int:
    a = torch.load(sys.argv[1], weights_only=False)
    b = torch.load(sys.argv[2], weights_only=False)
    ia = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    ib = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    print("device", a["info"]["device"], "|", b["info"]["device"])
    print("param digest equal:", a["info"]["param_digest"] == b["info"]["param_digest"])
    ra, rb = a["runs"][ia], b["runs"][ib]
    sa = [sorted(s["sched"].values()) for s in ra["steps"]]
    sb = [sorted(s["sched"].values()) for s in rb["steps"]]
    print("schedule shapes equal:", sa == sb, "steps", len(sa), len(sb))
    first = None
    for i, (la, lb) in enumerate(zip(ra["logits"], rb["logits"])):
        if la.shape != lb.shape:
            print(f"step {i}: shape {tuple(la.shape)} vs {tuple(lb.shape)}")
            continue
        d = (la - lb).abs()
        row = d.amax(dim=-1)
        nan = torch.isnan(la).any().item() or torch.isnan(lb).any().item()
        if (row > 0).any() or nan:
            print(f"step {i}: max|dlogit| per row {row.tolist()} nan={nan}")
            if first is None:
                first = i
    print("first step with any logit difference:", first)
    for p, (ta, tb) in enumerate(zip(ra["token_ids"], rb["token_ids"])):
        k = next((j for j, (x, y) in enumerate(zip(ta, tb)) if x != y), None)
        print(f"prompt {p}: first token divergence at {k}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
