#!/usr/bin/env python3
"""The GPU checks of issue 31 in one short run: everything a device call needs to show, as plain
PASS / FAIL lines and one JSON summary. Runs bin/tandem as subprocesses; standard library only, so
it runs under the GPU machine's python3 and under any python here.

    python3 tests/cuda/gpu_check.py [--device cuda] [--assets DIR] [--out DIR] [--only NAME,...]

Checks (each names its reference):
  ops        build/tests/cuda_vs_cpu: every Backend entry against the CPU oracle (cuda only)
  parity     eval --dtype fp32 on the 9 tiny fixtures and 3 real models against transformers'
             committed references: logprobs within 1e-4 (eval.bats' bound), greedy tokens exact
  bf16       eval --dtype bf16 against transformers computing the same bf16 function (X.bf16emu),
             every pair within 5 sigma (tests/bf16_fidelity.bats explains sigma and the 5)
  greedy_hf  generate --greedy equals transformers' greedy continuation on every fixture
  batch      generate --greedy on 70 prompts: identical bytes at --max-batch 1, 7 and 64
  rollout    sampled tokens' logprobs from paged decode == eval's whole-sequence forward, bit for
             bit (max diff 0), fp32 and bf16; and a 1e-6 perturbation fails (the check is live)
--device cpu runs the same checks on the CPU (validates this script; the ops check is skipped).
Exit 0 when every check passes, 1 otherwise.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# the binaries: $TANDEM (tests/cuda/device_env.sh points it at the bundle's) or the build's; the
# oracle harness beside it (the bundle keeps build/tests/ under its own folder)
TANDEM = os.path.abspath(os.environ.get("TANDEM") or os.path.join(ROOT, "bin", "tandem"))
BUILD = os.path.dirname(os.path.dirname(TANDEM))
FIX = os.path.join(ROOT, "tests", "fixtures")
TINY = ("llama_gqa mistral_swa qwen2_bias qwen2_swa llama3_rope llama_linear_rope llama_sharded llama_mqa "
        "llama_odd_vocab").split()
REAL = {"stories260K": "stories260K-hf", "tinystories-l2c": "tinystories-l2c-64d-500it-hf",
        "aidreams260K": "aidreams260K-hf"}
results = []


def run(args, timeout=300):
    t = time.time()
    p = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr, time.time() - t


def last_json(text):
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return None


def record(name, ok, detail):
    results.append({"check": name, "pass": bool(ok), "detail": detail})
    print(("PASS " if ok else "FAIL ") + name + ": " + json.dumps(detail), flush=True)


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(ln) for ln in f if ln.strip()]


def write_jsonl(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def models(a):
    out = [(f, os.path.join(FIX, "models", f), os.path.join(FIX, "refs", f + ".jsonl")) for f in TINY]
    for ref, m in REAL.items():
        d = os.path.join(a.assets, "models", m)
        if os.path.isdir(d):
            out.append((ref, d, os.path.join(FIX, "refs", ref + ".fp32.jsonl")))
        else:
            record("assets", False, {"missing": d})
    return out


def check_ops(a, tmp):
    binary = os.path.join(BUILD, "build", "tests", "cuda_vs_cpu")
    rc, out, err, s = run([binary])
    lines = out.strip().splitlines()
    fails = [ln for ln in lines if ln.startswith("FAIL")]
    with open(os.path.join(a.out, "cuda_vs_cpu.txt"), "w") as f:
        f.write(out + err)
    record("ops", rc == 0, {"rc": rc, "cases": len(lines), "fails": fails[:10], "tail": lines[-1:] if lines else err[-300:],
                            "seconds": round(s, 1)})


def check_parity(a, tmp):
    for name, model, ref in models(a):
        rc, out, err, s = run([TANDEM, "eval", "--device", a.device, "--dtype", "fp32", "--model", model, "--reference", ref,
                               "--max-logprob-diff", "1e-4", "--quiet"])
        j = last_json(out) or {}
        record("parity " + name, rc == 0 and j.get("pass") is True and j.get("greedy_mismatches") == 0,
               {"rc": rc, "max_abs_logprob_diff": j.get("max_abs_logprob_diff"), "p99": j.get("p99_abs_logprob_diff"),
                "greedy_mismatches": j.get("greedy_mismatches"), "err": err.strip()[-300:]})


def check_bf16(a, tmp):
    lam = 5.0
    for name, model, ref32 in models(a):
        ref = ref32.replace(".fp32.jsonl", ".jsonl").replace(".jsonl", ".bf16emu.jsonl")
        sig = read_jsonl(ref[:-len(".jsonl")] + ".sigma.jsonl")
        by_id = {g["id"]: g for g in sig}
        tied = []
        for r in read_jsonl(ref):     # a greedy step whose top-2 gap is under 5 sigma may go either way
            if r.get("greedy_ids"):
                r["greedy_tie_gap"] = [x * lam for x in by_id[r["id"]]["greedy_gap_sigma"]]
            tied.append(r)
        tied_path, ours = os.path.join(tmp, name + ".tied.jsonl"), os.path.join(tmp, name + ".ours.jsonl")
        write_jsonl(tied_path, tied)
        rc, out, err, s = run([TANDEM, "eval", "--device", a.device, "--dtype", "bf16", "--model", model, "--reference",
                               tied_path, "--max-logprob-diff", "1e30", "--write-reference", ours, "--quiet"])
        j = last_json(out) or {}
        rc2, out2, err2, _ = run([sys.executable, os.path.join(FIX, "check_bf16_sigma.py"), ref, ours, str(lam)]) \
            if rc == 0 else (1, "", "eval failed", 0)
        record("bf16 " + name, rc == 0 and rc2 == 0,
               {"rc": rc, "max_abs_logprob_diff": j.get("max_abs_logprob_diff"), "greedy_mismatches": j.get("greedy_mismatches"),
                "sigma": last_json(out2) or out2.strip()[-200:], "err": (err + err2).strip()[-300:]})


def prompts_from_ref(ref, path):
    write_jsonl(path, [{"id": r["id"], "input_ids": r["input_ids"], "max_new_tokens": len(r["greedy_ids"])}
                       for r in read_jsonl(ref) if r.get("greedy_ids")])


def check_greedy_hf(a, tmp):
    for name, model, ref in models(a):
        p, o = os.path.join(tmp, "p.jsonl"), os.path.join(tmp, "o.jsonl")
        prompts_from_ref(ref, p)
        rc, out, err, s = run([TANDEM, "generate", "--device", a.device, "--dtype", "fp32", "--model", model, "--input", p,
                               "--output", o, "--greedy", "--ignore-eos", "--block-size", "16"])
        want = {r["id"]: r["greedy_ids"] for r in read_jsonl(ref) if r.get("greedy_ids")}
        got = {r["id"]: r["completion_ids"] for r in read_jsonl(o)} if rc == 0 else {}
        bad = [i for i in want if got.get(i) != want[i]]
        record("greedy_hf " + name, rc == 0 and not bad, {"rc": rc, "records": len(want), "differ": bad[:5],
                                                          "err": err.strip()[-300:]})


def check_batch(a, tmp):
    model = os.path.join(a.assets, "models", "stories260K-hf")
    p = os.path.join(tmp, "p70.jsonl")
    write_jsonl(p, [{"id": f"p{i}", "prompt": "Once upon a time " + "the cat sat on the mat " * (i % 7 + 1) + "and",
                     "max_new_tokens": 10 + i % 13} for i in range(1, 71)])
    outs = {}
    for dtype in ("fp32", "bf16"):
        for b in (1, 7, 64):
            o = os.path.join(tmp, f"b{b}.{dtype}.jsonl")
            rc, out, err, s = run([TANDEM, "generate", "--device", a.device, "--dtype", dtype, "--model", model, "--input", p,
                                   "--output", o, "--greedy", "--max-batch", str(b)])
            outs[(dtype, b)] = open(o, "rb").read() if rc == 0 else b"rc=%d %s" % (rc, err.encode()[-200:])
        same = outs[(dtype, 1)] == outs[(dtype, 7)] == outs[(dtype, 64)]
        record("batch " + dtype, same and outs[(dtype, 1)].count(b"\n") == 70,
               {"lines": outs[(dtype, 1)].count(b"\n"), "b1_eq_b7": outs[(dtype, 1)] == outs[(dtype, 7)],
                "b1_eq_b64": outs[(dtype, 1)] == outs[(dtype, 64)]})


def paged_vs_eval(a, tmp, model, dtype, extra):
    p, g = os.path.join(tmp, "pv.jsonl"), os.path.join(tmp, "gv.jsonl")
    write_jsonl(p, [{"input_ids": [1, 5, 9, 13, 2, 7]}, {"input_ids": [1, 9, 13]}, {"input_ids": [1, 3]}])
    rc, out, err, s = run([TANDEM, "generate", "--device", a.device, "--dtype", dtype, "--model", model, "--input", p,
                           "--output", g, "--max-new-tokens", "24", "--ignore-eos", "--logprobs", "1", "--temperature",
                           "0.9", "--seed", "5", "--max-batch", "2"] + extra)
    if rc != 0:
        return {"rc": rc, "err": err.strip()[-300:]}, False
    ref = []
    for r in read_jsonl(g):
        n_prompt = len(r["prompt"])
        top = [[] for _ in range(n_prompt - 1)] + [[[x["token"], x["logprob"]]] for x in r["logprobs"]] + [[]]
        ref.append({"input_ids": r["prompt"] + r["completion_ids"], "top_logprobs": top})
    refp, badp = os.path.join(tmp, "rv.jsonl"), os.path.join(tmp, "bv.jsonl")
    write_jsonl(refp, ref)
    for r in ref:
        r["top_logprobs"] = [[[t[0][0], t[0][1] + 1e-6]] if t else t for t in r["top_logprobs"]]
    write_jsonl(badp, ref)
    ev = [TANDEM, "eval", "--device", a.device, "--dtype", dtype, "--model", model, "--max-logprob-diff", "0", "--reference"]
    rc1, out1, err1, _ = run(ev + [refp])
    rc2, out2, err2, _ = run(ev + [badp])
    j1, j2 = last_json(out1) or {}, last_json(out2) or {}
    ok = rc1 == 0 and j1.get("max_abs_logprob_diff") == 0 and j1.get("records") == 3 and rc2 == 1
    return {"max_abs_logprob_diff": j1.get("max_abs_logprob_diff"), "records": j1.get("records"), "perturbed_rc": rc2,
            "err": (err1 + err2).strip()[-300:]}, ok


def check_rollout(a, tmp):
    cases = [("mistral_swa", os.path.join(FIX, "models", "mistral_swa"), []),
             ("llama3_rope", os.path.join(FIX, "models", "llama3_rope"), []),
             ("mistral_swa blocks2", os.path.join(FIX, "models", "mistral_swa"), ["--block-size", "2", "--kv-cache-mem", "0.01"]),
             ("stories260K", os.path.join(a.assets, "models", "stories260K-hf"), [])]
    for dtype in ("fp32", "bf16"):
        for name, model, extra in cases:
            detail, ok = paged_vs_eval(a, tmp, model, dtype, extra)
            record(f"rollout {dtype} {name}", ok, detail)


CHECKS = {"ops": check_ops, "parity": check_parity, "bf16": check_bf16, "greedy_hf": check_greedy_hf,
          "batch": check_batch, "rollout": check_rollout}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--assets", default=os.path.join(ROOT, "..", "shared", "assets"))
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--only", default=",".join(CHECKS))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.only.split(","):
            if name == "ops" and a.device != "cuda":
                continue
            try:
                CHECKS[name](a, tmp)
            except Exception as e:   # one broken check must not hide the others' results
                record(name, False, {"exception": repr(e)[-300:]})
    passed = sum(r["pass"] for r in results)
    summary = {"device": a.device, "passed": passed, "failed": len(results) - passed, "seconds": round(time.time() - t0, 1)}
    with open(os.path.join(a.out, "gpu_check.json"), "w") as f:
        json.dump({"summary": summary, "results": results}, f, indent=1)
    print(json.dumps(summary))
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
