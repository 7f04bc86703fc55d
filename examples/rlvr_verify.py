#!/usr/bin/env python3
"""Stand-in for `tandem verify math` / `--reward-fn math` in examples/rlvr.sh, on integer answers only:
reward 1 when the last \\boxed{...} of "response" holds the reference ("label" as ppo's --reward-cmd
sends it, or "answer" as tandem verify reads it) as the same integer, else 0. Reads jsonl on stdin,
writes one {"reward", "reason"} line per input line (with the input's "id" if any), flushed, so it
serves both as a --reward-cmd program and as the held-out scorer."""
import json
import re
import sys

BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def score(response, ref):
    found = BOXED.findall(response or "")
    if not found:
        return 0.0, "no \\boxed{}"
    got = found[-1].strip()
    try:
        return (1.0, "equal") if int(got) == int(str(ref).strip()) else (0.0, "different")
    except ValueError:
        return 0.0, "not an integer"


for line in sys.stdin:
    if not line.strip():
        continue
    r = json.loads(line)
    ref = r.get("label", r.get("answer"))
    reward, reason = score(r.get("response"), ref)
    out = {"reward": reward, "reason": reason}
    if "id" in r:
        out["id"] = r["id"]
    print(json.dumps(out), flush=True)
