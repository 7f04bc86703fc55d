#!/usr/bin/env bash
# The data of examples/rlvr.sh: every sum a + b of two integers 0..99, split by the held-out rule
# (a + 2b) mod 7 == 0 (1429 pairs held out, 8571 to train on). Writes into DIR:
#   sft.jsonl          {"prompt": "What is 37 + 58?", "response": " 7 + 8 = 15, 3 + 5 + 1 = 9. \\boxed{95}"}
#                      training pairs: the units' sum, then the tens' with the carry, then the answer
#   rl.jsonl           {"prompt": ..., "answer": "95"}  training pairs (ppo's prompts, --reward-fn math)
#   val.jsonl          {"prompt": ..., "answer": "95"}  296 training pairs (every 29th): SFT's stopping check
#   heldout_all.jsonl  {"prompt": ..., "answer": "95"}  every held-out pair
# Usage: examples/rlvr_data.sh DIR
set -euo pipefail
D=${1:?usage: rlvr_data.sh DIR}
mkdir -p "$D"
awk -v d="$D" 'BEGIN {
    for (a = 0; a < 100; a++) for (b = 0; b < 100; b++) {
        p = sprintf("\"prompt\": \"What is %d + %d?\"", a, b); s = a + b
        if ((a + 2 * b) % 7 == 0) { printf "{%s, \"answer\": \"%d\"}\n", p, s > d "/heldout_all.jsonl"; continue }
        u = a % 10 + b % 10; c = int(u / 10)      # units sum and carry, then tens
        printf "{%s, \"response\": \" %d + %d = %d, %d + %d + %d = %d. \\\\boxed{%d}\"}\n", p,
            a % 10, b % 10, u, int(a / 10), int(b / 10), c, int(a / 10) + int(b / 10) + c, s > d "/sft.jsonl"
        printf "{%s, \"answer\": \"%d\"}\n", p, s > d "/rl.jsonl"
        if (n++ % 29 == 0) printf "{%s, \"answer\": \"%d\"}\n", p, s > d "/val.jsonl"
    } }'
