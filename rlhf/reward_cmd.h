/* reward_cmd.h — rewards from a user's program: a long-lived subprocess (`sh -c CMD`) speaking jsonl.
 * For each response Tandem writes one line {"prompt": ..., "response": ..., "label": ..., "index": i}
 * (label only when the prompt line had one; any JSON value; index: the response's place in the
 * batch, 0 .. n-1) to its stdin and reads one line {"reward": number} (other fields ignored) from its
 * stdout, in the same order: exactly one reply per request. A reply may echo "index"; when it does,
 * it must be the index of the request it answers (the one sure check of the pairing: without it, a
 * surplus line is seen only when it is there right after the batch's replies or comes before its
 * request was written). A reward is finite and within +-REWARD_ABS_MAX.
 * Writing and reading overlap (poll), so a program that answers line by line and one that reads
 * everything first both work; the program must flush its output. Its stderr passes through.
 * Owns: the child process, the pipes, the protocol and its errors. */
#ifndef TANDEM_REWARD_CMD_H
#define TANDEM_REWARD_CMD_H
#include <stddef.h>

/* The bound on every reward, from any source (this program, a reward server, a reward model's
 * score): |reward| <= 1e6. Far above any reward scale in use (verifiers give 0 / 1, reward models
 * O(1-10)), and far enough below float's 3.4e38 that the shaped scores, RLOO's G / (G - 1), GAE's
 * sums over a response and the loss's advantage x ratio stay finite in the float copies the update
 * uses; a larger reward is a bug on the other side, and a stop beats an all-NaN checkpoint. */
#define REWARD_ABS_MAX 1e6

typedef struct RewardCmd RewardCmd;

/* Starts `sh -c cmd` (the program), in a session of its own, under a keeper (rlhf/subproc.c KEEPER)
 * that kills it and all it started when it exits, when reward_cmd_stop says so, or when this
 * process ends, however it ends. Call from the main thread. NULL and a message in err when it
 * cannot be started. */
RewardCmd *reward_cmd_start(const char *cmd, char *err, size_t errlen);
/* Scores n responses: rewards (n). labels[i] is a JSON text or NULL (no "label" field); labels may
 * be NULL. Returns 0, or -1 with a one-line message in err naming the command and what went wrong:
 * the program exited (with its status), closed its output, wrote a line that is not a JSON object
 * with a finite number "reward" (the line, cut to 200 bytes, is quoted), a reward outside
 * +-REWARD_ABS_MAX, an "index" that is not its request's, more replies than requests (a line after
 * the batch's n replies, or a reply that came before its request was written), or did not answer
 * within timeout_s seconds (0 = no limit). After an error the RewardCmd is unusable (stop it). */
int reward_cmd_score(RewardCmd *rc, int n, const char *const *prompts, const char *const *responses,
                     const char *const *labels, double *rewards, double timeout_s, char *err, size_t errlen);
/* The replies part of reward_cmd_score alone, on a program's whole output bytes[0..len) to a batch of
 * n requests (all written): the same line framing and checks, the same messages (naming `name` as
 * the command). 0 with rewards (n), or -1 with the message in err. For tests and the fuzz harness
 * (tests/fuzz/libfuzz.sh): no process is started. */
int reward_cmd_parse_replies(const char *name, const char *bytes, size_t len, int n, double *rewards, char *err,
                             size_t errlen);
/* Closes its stdin, waits for it (killing it after 5 s), frees. NULL is a no-op. */
void reward_cmd_stop(RewardCmd *rc);
#endif
