#!/usr/bin/env python3
"""fuzz.py — random bad input against the tandem binary (a developer tool, not part of `make test`).

    python3 tests/fuzz/fuzz.py BIN TARGET [--runs N] [--seed S] [--keep DIR]
    TARGET: generate (prompt jsonl + sampling flags), checkpoint (config.json and safetensors
            header/body damage), sft (training records in all four formats), eval (reference lines)

Every run must end one of two ways: exit 0 (generate: every output line is JSON and the file ends
in a newline), or exit 1 with exactly one "tandem: ..." line on stderr (warnings aside) and, for
generate, nothing written. Any other exit (a signal, an abort), a sanitizer report, or a second
error line is a problem: the input, flags and stderr are kept under --keep. Runs are reproducible
from --seed. BIN may be a wrapper script (run.sh makes one that runs two pipeline stages under
mpirun). bash tests/fuzz/run.sh builds an ASan/UBSan binary and runs all four.
"""
import argparse, json, os, random, shutil, struct, subprocess, sys, tempfile

ASSETS = os.path.join(os.path.dirname(__file__), '..', '..', '..', 'shared', 'assets', 'models')
FIX = os.path.join(os.path.dirname(__file__), '..', 'fixtures')
STORIES = os.path.normpath(os.path.join(ASSETS, 'stories260K-hf'))
ODD = [None, True, False, 0, 1, -1, 0.5, -0.5, 1e9, -1e9, 1e300, float('nan'), 2**31, 2**63, -2**63, 2**64,
       "", "x", "é😀", "\u0000a", [], [1], [1, 2, 3], ["a", ""], [[1]], {}, {"a": 1}, [-1], [512], [2**31]]


def damage(b, R):
    """a few byte flips, insertions or a truncation"""
    b = bytearray(b)
    for _ in range(R.randint(1, 4)):
        if not b:
            break
        i, op = R.randrange(len(b)), R.random()
        if op < .3:
            b[i] = R.randrange(256)
        elif op < .6:
            del b[i:]
        else:
            b.insert(i, R.randrange(256))
    return bytes(b)


def turns(R, rk, ck, roles):
    out = []
    for _ in range(R.randint(0, 4)):
        m = {}
        if R.random() < .9:
            m[rk] = R.choice(roles + ["", 3, None, "robot"])
        if R.random() < .9:
            m[ck] = R.choice(["hi there", "", 5, None, ["x"], "é😀", "story " * 50])
        out.append(m if R.random() < .9 else R.choice(ODD))
    return out


# ---- targets: each writes its input under d and returns (argv after BIN, output file or None) ----

def case_generate(R, d):
    keys = ["prompt", "messages", "input_ids", "id", "temperature", "top_k", "top_p", "min_p",
            "repetition_penalty", "presence_penalty", "frequency_penalty", "max_new_tokens", "min_new_tokens",
            "stop", "stop_token_ids", "seed", "logprobs", "greedy", "ignore_eos", "text", "foo"]
    lines = []
    for _ in range(R.randint(1, 4)):
        o = {}
        if R.random() < .8:
            o["prompt"] = R.choice(["Once upon a time", "", "é😀 \n\t", "x" * R.randint(0, 3000)])
        for _ in range(R.randint(0, 5)):
            k = R.choice(keys)
            o[k] = turns(R, "role", "content", ["user", "assistant", "system"]) if k == "messages" and R.random() < .7 else R.choice(ODD)
        if R.random() < .2:
            o["input_ids"] = [R.choice([1, 2, 100, 511, 512, -1, 0]) for _ in range(R.randint(0, 600))]
        s = (json.dumps(o) if R.random() < .9 else json.dumps(R.choice(ODD))).encode()
        lines.append(damage(s, R) if R.random() < .15 else s)
    inp, out = os.path.join(d, "in.jsonl"), os.path.join(d, "out.jsonl")
    open(inp, "wb").write(b"\n".join(lines) + (b"\n" if R.random() < .8 else b""))
    flags = {"--temperature": ["0", "0.7", "-1", "nan", "inf", "1e40", "x"], "--top-k": ["0", "5", "-1", "99999999999"],
             "--top-p": ["1", "0.5", "0", "1.5", "nan"], "--min-p": ["0", "0.1", "1", "-0.1", "2"],
             "--max-new-tokens": ["1", "8", "0", "-1", "100000"], "--min-new-tokens": ["0", "3", "-2", "50"],
             "--kv-cache-mem": ["1", "0", "-5", "64"], "--block-size": ["16", "1", "0", "-1", "7"],
             "--max-batch": ["1", "3", "0", "-1"], "--max-batch-tokens": ["1", "64", "0"],
             "--logprobs": ["0", "2", "-1", "100000"], "--seed": ["0", "-1", "18446744073709551615", "x"],
             "--stop": ["", "a", "\n"], "--stop-token-ids": ["2", "-1", "x", "1,2", "99999"],
             "--repetition-penalty": ["1.1", "0", "-1"], "--threads": ["1", "2", "0", "-3"],
             "--input-key": ["prompt", "text", "id"]}
    args = ["generate", "--model", STORIES, "--input", inp, "--output", out, "--max-new-tokens", "8"]
    for _ in range(R.randint(0, 3)):
        k = R.choice(list(flags))
        args += [k, R.choice(flags[k])]
    if R.random() < .1:
        args.append(R.choice(["--greedy", "--ignore-eos", "--truncate", "--no-bos", "--resume"]))
    return args, out


def case_checkpoint(R, d):
    cfg = json.load(open(os.path.join(STORIES, "config.json")))
    st = open(os.path.join(STORIES, "model.safetensors"), "rb").read()
    n = struct.unpack("<Q", st[:8])[0]
    hdr, body, raw = json.loads(st[8:8 + n]), st[8 + n:], None
    odd = [None, True, 0, 1, -1, 2, 3, 7, 8, 63, 64, 65, 512, 513, 100000, 2**31, 2**40, 0.5, 1e-5, 1e30,
           float('nan'), "", "llama", [], {}, [2, 3], {"type": "linear", "factor": 2.0}, {"rope_type": "llama3"}]
    names = [k for k in hdr if "data_offsets" in hdr[k]]
    for _ in range(R.randint(1, 3)):
        op = R.randrange(9)
        k = R.choice(names)
        if op <= 2:
            key = R.choice(list(cfg) + ["head_dim", "sliding_window", "rope_scaling", "use_sliding_window", "max_window_layers"])
            if R.random() < .2:
                cfg.pop(key, None)
            else:
                cfg[key] = R.choice(odd)
        elif op == 3 and k in hdr and hdr[k]["shape"]:
            sh = hdr[k]["shape"]
            i = R.randrange(len(sh))
            sh[i] = R.choice([0, 1, sh[i] + 1, sh[i] - 1, 2**40, -1])
        elif op == 4 and k in hdr:
            hdr[k]["dtype"] = R.choice(["F32", "BF16", "F16", "F64", "I32", "U8", "", 5])
        elif op == 5 and k in hdr:
            o = hdr[k]["data_offsets"]
            i = R.randrange(2)
            o[i] = R.choice([0, o[i] + 4, o[i] - 4, 2**62, -1, len(body) + 8])
        elif op == 6:
            hdr.pop(k, None)
        elif op == 7:
            body = body[:R.randrange(len(body))]
        else:
            raw = damage(json.dumps(hdr).encode(), R)
    h = raw if raw is not None else json.dumps(hdr).encode()
    hlen = len(h) if R.random() < .95 else R.choice([0, 7, len(h) + 100, 2**40])
    m = os.path.join(d, "model")
    os.makedirs(m)
    shutil.copy(os.path.join(STORIES, "tokenizer.model"), m)
    open(os.path.join(m, "model.safetensors"), "wb").write(struct.pack("<Q", hlen) + h + body)
    open(os.path.join(m, "config.json"), "w").write(json.dumps(cfg))
    inp, out = os.path.join(d, "in.jsonl"), os.path.join(d, "out.jsonl")
    open(inp, "w").write('{"prompt": "Once upon a time"}\n{"input_ids": [1, 5, 9]}\n')
    return ["generate", "--model", m, "--input", inp, "--output", out, "--max-new-tokens", "4"], out


def case_sft(R, d):
    def value(extra):
        return R.choice(ODD + [extra])
    recs = []
    for _ in range(R.randint(1, 6)):
        f = R.randrange(5)
        o = ({"prompt": value("Tell me"), "response": value("A story.")} if f == 0 else
             {"instruction": value("Do"), "input": value("x"), "output": value("y")} if f == 1 else
             {"messages": turns(R, "role", "content", ["user", "assistant", "system"])} if f == 2 else
             {"conversations": turns(R, "from", "value", ["human", "gpt", "system"])} if f == 3 else R.choice(ODD))
        if isinstance(o, dict):
            for _ in range(R.randint(0, 2)):
                k = R.choice(list(o) + ["foo"])
                if R.random() < .5:
                    o.pop(k, None)
                else:
                    o[k] = R.choice(ODD)
        s = json.dumps(o).encode()
        recs.append(damage(s, R) if R.random() < .1 else s)
    array = R.random() < .15
    data = os.path.join(d, "data.json" if array else "data.jsonl")
    open(data, "wb").write(b"[" + b",\n".join(recs) + b"]" if array else b"\n".join(recs) + b"\n")
    args = ["sft", "--model", STORIES, "--data", data, "--out", os.path.join(d, "run"), "--max-steps", "1",
            "--seq-len", "64", "--batch-size", "2", "--micro-batches", "1", "--threads", "1"]
    for _ in range(R.randint(0, 2)):
        args += R.choice([["--skip-bad-lines"], ["--pack"], ["--drop-long"], ["--train-on-prompt"],
                          ["--seq-len", R.choice(["1", "2", "0", "-1", "8"])], ["--batch-size", R.choice(["0", "1", "-1", "100"])],
                          ["--lr", R.choice(["0", "-1", "nan", "1e9"])], ["--eval-data", data], ["--warmup", R.choice(["5", "-1"])]])
    return args, None


def case_eval(R, d):
    refs = [json.loads(line) for line in open(os.path.join(FIX, "refs", "llama_gqa.jsonl"))]
    odd = ODD + [[[1, -0.5]], [[[1, -0.5]]], [[["a", 0]]], [10**6]]

    def mutate(o):
        if isinstance(o, dict) and o and R.random() < .6:
            o, k, r = dict(o), R.choice(list(o)), R.random()
            if r < .3:
                del o[k]
            else:
                o[k] = R.choice(odd) if r < .7 else mutate(o[k])
            return o
        if isinstance(o, list) and o:
            o, i, r = list(o), R.randrange(len(o)), R.random()
            if r < .3:
                del o[i:]
            elif r < .8:
                o[i] = R.choice(odd) if r < .5 else mutate(o[i])
            else:
                o.append(R.choice(odd))
            return o
        return R.choice(odd) if R.random() < .5 else o
    lines = []
    for _ in range(R.randint(1, 3)):
        o = R.choice(refs)
        for _ in range(R.randint(1, 3)):
            o = mutate(o)
        s = json.dumps(o).encode()
        lines.append(s[:R.randrange(len(s) + 1)] if R.random() < .1 else s)
    ref = os.path.join(d, "ref.jsonl")
    open(ref, "wb").write(b"\n".join(lines) + b"\n")
    return ["eval", "--model", os.path.join(FIX, "models", "llama_gqa"), "--reference", ref], None


TARGETS = {"generate": case_generate, "checkpoint": case_checkpoint, "sft": case_sft, "eval": case_eval}


def problem(p, out):
    err = p.stderr.decode(errors="replace")
    if p.returncode not in (0, 1):
        return f"exit {p.returncode}"
    if "runtime error" in err or "AddressSanitizer" in err:
        return "sanitizer report"
    if p.returncode == 1:
        lines = [l for l in err.splitlines() if l.strip() and not l.startswith("tandem: warning: ")]
        # eval's own verdict (logprobs differ) prints its report first: that is a result, not bad input
        lines = [l for l in lines if not l.startswith(("+", "|"))]
        if len(lines) != 1 or not lines[0].startswith("tandem: "):
            return "error is not one tandem: line"
        if out and os.path.exists(out) and os.path.getsize(out):
            return "output written on error"
        return None
    if out:
        data = open(out, "rb").read() if os.path.exists(out) else b""
        if data and not data.endswith(b"\n"):
            return "partial output line"
        for l in data.splitlines():
            try:
                json.loads(l)
            except ValueError:
                return "output line is not JSON"
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin")
    ap.add_argument("target", choices=TARGETS)
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", default="fuzz-problems")
    a = ap.parse_args()
    if not os.path.exists(os.path.join(STORIES, "config.json")):
        print(f"fuzz: {STORIES} is absent (../shared/assets): nothing run")
        return 2
    R, bad = random.Random(f"{a.target}:{a.seed}"), 0
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0")   # Open MPI and hwloc leak at exit by design
    for i in range(a.runs):
        with tempfile.TemporaryDirectory() as d:
            args, out = TARGETS[a.target](R, d)
            try:
                p = subprocess.run([a.bin] + args, capture_output=True, timeout=120, env=env)
                why = problem(p, out)
            except subprocess.TimeoutExpired:
                p, why = None, "timeout (120 s)"
            if why:
                bad += 1
                keep = os.path.join(a.keep, f"{a.target}-{a.seed}-{i}")
                shutil.copytree(d, keep, dirs_exist_ok=True)
                open(os.path.join(keep, "argv"), "w").write(" ".join(args) + "\n")
                if p:
                    open(os.path.join(keep, "stderr"), "wb").write(p.stderr[-8000:])
                print(f"fuzz {a.target} run {i}: {why} (kept in {keep})", flush=True)
    print(f"fuzz {a.target}: {a.runs} runs, {bad} problems")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
