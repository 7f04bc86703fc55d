#!/usr/bin/env python3
"""lookup_env.py - the lookup environment of examples/tool_use.sh, and its data (python3 stdlib only).

As `tandem ppo --env-cmd "python3 examples/lookup_env.py"` (no arguments): JSON lines on stdin and
stdout, several episodes interleaved (each message names its episode; one reply per message, flushed):
  {"type": "reset", "episode": E, "prompt": {"prompt": "What is the number of kivo?", "name": "kivo", "number": "4821"}}
      -> {"episode": E, "observation": ""}
  {"type": "step", "episode": E, "turn": T, "action": "<the model's text of turn T>", ...}
      -> {"episode": E, "environment_feedback": F, "reward": R, "done": D}
  an action with <answer>N</answer>         ends the episode: reward 1 when N is the line's number, else 0
  else one with <lookup>NAME</lookup>       (spaces around NAME ignored) F = "<result>NUMBER</result>" for the line's own name,
                                            "<result>unknown</result>" for any other; reward 0; done at turn 3
  else (no tool call, no answer)            ends the episode with reward 0
An episode is at most 3 turns (done at the third whatever it holds).

As `python3 examples/lookup_env.py data DIR [SEED [N_TRAIN [N_HELD]]]`: writes the example's data.
Names are 3-8 lowercase letters, numbers 4 digits; a name is held out when the sum of its letters'
places in the alphabet (a = 1) is a multiple of 5, a number when the sum of its digits is: training
lines have a training name and number, held-out lines a held-out name and number, so none of the
held-out names or numbers is ever seen in training (`check FILE` says whether a file is held out).
  sft.jsonl      demonstrations of N_TRAIN training lines (default 4000), each as two prompt/response records, so that
                 the environment's tokens are prompt (out of the loss) and the ids are a rollout's:
                   {"prompt": Q, "response": "<lookup> NAME</lookup>"}
                   {"prompt": Q + " <lookup> NAME</lookup> <result>NUMBER</result>", "response": "<answer>NUMBER</answer>"}
                 The name is written after a space, as in the question, so that its pieces in the call are
                 the question's ("\u2581t" "k" "z" ... both times): the model copies ids. Without the space
                 every name's first piece differs from the question's (" tkzvdgt?" -> "\u2581t" ...; "<lookup>tkzvdgt"
                 -> ">" "t" ...) and 6% of names are cut into other pieces too: GRPO then stalled near 0.7.
                 (SentencePiece encodes each space-separated word alone with its "\u2581", so `tandem sft`'s
                 [BOS] encode(prompt) encode(response) are exactly the ids of prompt, the model's turn
                 ending at the stop "</lookup>", the feedback tokenised on its own, and the next turn.)
  val.jsonl      200 more training lines (SFT's stopping check)
  heldout.jsonl  N_HELD held-out lines (default 200)
  rl.jsonl       {"prompt", "name", "number"}  N_TRAIN more training lines, the GRPO prompts: names
                 the demonstrations did not show (else GRPO can lean on what SFT memorised)
  turn1.jsonl, turn2.jsonl (of val.jsonl and heldout.jsonl: val_turn1.jsonl ...) the two turns'
                 prompts for a greedy check with `tandem generate` (score: `python3 lookup_env.py score`)
"""
import json
import random
import re
import sys

MAX_TURNS = 3
ANSWER = re.compile(r"<answer>\s*([0-9]+)\s*</answer>")
LOOKUP = re.compile(r"<lookup>\s*([^<]*?)\s*</lookup>")


def held_name(name):
    return sum(ord(c) - 96 for c in name) % 5 == 0


def held_number(number):
    return sum(int(c) for c in number) % 5 == 0


def question(name):
    return "What is the number of %s?" % name


def step(line, turn, action):
    """(feedback, reward, done) of one turn."""
    m = ANSWER.search(action)
    if m:
        return "", 1.0 if m.group(1) == line["number"] else 0.0, True
    m = LOOKUP.search(action)
    if m:
        found = line["number"] if m.group(1) == line["name"] else "unknown"
        return "<result>%s</result>" % found, 0.0, turn >= MAX_TURNS
    return "", 0.0, True


def serve():
    episodes = {}   # episode id -> its prompt line
    for raw in sys.stdin:
        if not raw.strip():
            continue
        msg = json.loads(raw)
        e = msg["episode"]
        if msg["type"] == "reset":
            episodes[e] = msg["prompt"]
            reply = {"episode": e, "observation": ""}
        else:
            feedback, reward, done = step(episodes[e], msg["turn"], msg["action"])
            if done:
                del episodes[e]
            reply = {"episode": e, "environment_feedback": feedback, "reward": reward, "done": done}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


def draw(rng, held, seen):
    """A new (name, number) of the held-out class or the training class."""
    while True:
        name = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 8)))
        if held_name(name) == held and name not in seen:
            break
    while True:
        number = str(rng.randint(1000, 9999))
        if held_number(number) == held:
            break
    seen.add(name)
    return {"prompt": question(name), "name": name, "number": number}


def write(path, lines):
    with open(path, "w") as f:
        for x in lines:
            f.write(json.dumps(x) + "\n")


def turns(lines):
    """The two turns' prompts: the question; the question, the right lookup and its result."""
    t1 = [{"id": i, "prompt": x["prompt"]} for i, x in enumerate(lines)]
    t2 = [{"id": i, "prompt": "%s <lookup> %s</lookup> <result>%s</result>" % (x["prompt"], x["name"], x["number"])}
          for i, x in enumerate(lines)]
    return t1, t2


def data(d, seed=1, n_train=4000, n_held=200):
    rng, seen = random.Random(seed), set()
    demo = [draw(rng, False, seen) for _ in range(n_train)]
    val = [draw(rng, False, seen) for _ in range(200)]
    held = [draw(rng, True, seen) for _ in range(n_held)]
    rl = [draw(rng, False, seen) for _ in range(n_train)]
    write(d + "/rl.jsonl", rl)
    write(d + "/val.jsonl", val)
    write(d + "/heldout.jsonl", held)
    sft = []
    for x in demo:
        sft.append({"prompt": x["prompt"], "response": "<lookup> %s</lookup>" % x["name"]})
        sft.append({"prompt": "%s <lookup> %s</lookup> <result>%s</result>" % (x["prompt"], x["name"], x["number"]),
                    "response": "<answer>%s</answer>" % x["number"]})
    rng.shuffle(sft)
    write(d + "/sft.jsonl", sft)
    for name, lines in (("val", val), ("heldout", held)):
        t1, t2 = turns(lines)
        write("%s/%s_turn1.jsonl" % (d, name), t1)
        write("%s/%s_turn2.jsonl" % (d, name), t2)


def check(path):
    """Exit 1 naming the first line that is not a well-formed held-out line."""
    for i, raw in enumerate(open(path), 1):
        x = json.loads(raw)
        name, number = x.get("name", ""), x.get("number", "")
        why = None
        if not re.fullmatch(r"[a-z]{3,8}", name) or not re.fullmatch(r"[0-9]{4}", number):
            why = "name %r / number %r: expected 3-8 lowercase letters and 4 digits" % (name, number)
        elif x.get("prompt") != question(name):
            why = "prompt %r is not %r" % (x.get("prompt"), question(name))
        elif not held_name(name) or not held_number(number):
            why = "%s / %s is not held out (letter sum, digit sum not both multiples of 5)" % (name, number)
        if why:
            sys.exit("%s:%d: %s" % (path, i, why))


def score(lines_path, gen1, gen2):
    """The greedy success rate of two `tandem generate` outputs (turn 1 from the question, turn 2 given
    the right lookup): an episode succeeds when turn 1 calls <lookup> of the line's name (and nothing
    else first) and turn 2 answers its number; what the environment would score when turn 1 is right."""
    lines = [json.loads(r) for r in open(lines_path)]
    def text(path, stop):   # generate leaves the stop string out of "completion": put it back
        out = {}
        for o in map(json.loads, open(path)):
            at_stop = o["finish_reason"] == "stop" and o["completion_ids"][-1] not in (1, 2)   # not BOS / EOS
            out[o["id"]] = o["completion"] + (stop if at_stop else "")
        return out
    c1, c2 = text(gen1, "</lookup>"), text(gen2, "</answer>")
    ok = 0
    for i, x in enumerate(lines):
        fb, _, done = step(x, 1, c1[i])
        if done or fb != "<result>%s</result>" % x["number"]:
            continue
        ok += step(x, 2, c2[i])[1] == 1.0
    print("%.4f" % (ok / len(lines)))


if __name__ == "__main__":
    a = sys.argv[1:]
    if not a:
        serve()
    elif a[0] == "data" and 2 <= len(a) <= 5:
        data(a[1], *map(int, a[2:]))
    elif a[0] == "check" and len(a) == 2:
        check(a[1])
    elif a[0] == "score" and len(a) == 4:
        score(*a[1:])
    else:
        sys.exit("usage: lookup_env.py | lookup_env.py data DIR [SEED [N_TRAIN [N_HELD]]] | check FILE | score LINES GEN1 GEN2")
