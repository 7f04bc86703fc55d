/* reward_cmd.h — rewards from a user's program: a long-lived subprocess (`sh -c CMD`) speaking jsonl.
 * For each response Tandem writes one line {"prompt": ..., "response": ..., "label": ...} (label
 * only when the prompt line had one; any JSON value) to its stdin and reads one line
 * {"reward": number} (other fields ignored) from its stdout, in the same order. Writing and reading
 * overlap (poll), so a program that answers line by line and one that reads everything first both
 * work; the program must flush its output. Its stderr passes through.
 * Owns: the child process, the pipes, the protocol and its errors. */
#ifndef TANDEM_REWARD_CMD_H
#define TANDEM_REWARD_CMD_H
#include <stddef.h>

typedef struct RewardCmd RewardCmd;

/* Starts `sh -c cmd`. NULL and a message in err when it cannot be started. */
RewardCmd *reward_cmd_start(const char *cmd, char *err, size_t errlen);
/* Scores n responses: rewards (n). labels[i] is a JSON text or NULL (no "label" field); labels may
 * be NULL. Returns 0, or -1 with a one-line message in err naming the command and what went wrong:
 * the program exited (with its status), closed its output, wrote a line that is not a JSON object
 * with a finite number "reward" (the line, cut to 200 bytes, is quoted), or did not answer within
 * timeout_s seconds (0 = no limit). After an error the RewardCmd is unusable (stop it). */
int reward_cmd_score(RewardCmd *rc, int n, const char *const *prompts, const char *const *responses,
                     const char *const *labels, double *rewards, double timeout_s, char *err, size_t errlen);
/* Closes its stdin, waits for it (killing it after 5 s), frees. NULL is a no-op. */
void reward_cmd_stop(RewardCmd *rc);
#endif
