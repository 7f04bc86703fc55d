/* env.h — environments for multi-turn rollouts (tool calls, games): a user's program (--env-cmd,
 * `sh -c CMD`, a long-lived subprocess speaking JSON lines on stdin/stdout, several episodes
 * interleaved) or HTTP servers (--env-url, POST URL/reset and URL/step with the same JSON bodies).
 * The messages follow OpenRLHF's agent interface:
 *   {"type": "reset", "episode": E, "prompt": <the prompt line, a JSON object>}
 *       -> {"episode": E, "observation": "..."}                 (text appended after the prompt)
 *   {"type": "step", "episode": E, "turn": T, "action": "<the model's text>", "action_ids": [...]}
 *       -> {"episode": E, "environment_feedback": "...", "reward": R, "done": BOOL}
 * Episode ids are unique over the run (the caller's numbering), so a late reply to an episode that
 * already ended is recognised and dropped.
 * Faults of one episode (a reply that is not a JSON object with the fields above, one naming an
 * episode not asked about, no reply within the timeout) end that episode only: its EnvReply.fault says
 * which, and the caller scores it 0. Faults of the environment itself (the program exited or closed
 * its output, no server reachable at all) are an error of the call.
 * Owns: the child process or the HTTP client, the protocol, its per-episode faults and its errors.
 * Does not own: tokenising, episodes' state, rewards' use (rlhf/experience.c). */
#ifndef TANDEM_ENV_H
#define TANDEM_ENV_H
#include <stddef.h>

typedef enum {
    ENV_OK = 0,
    ENV_BAD_REPLY,        /* not a JSON object, or a field missing / of the wrong type, a reward not finite
                             or beyond +-REWARD_ABS_MAX */
    ENV_WRONG_EPISODE,    /* (a program) the only reply that came names an episode not in this call; or
                             (a server) the reply names another episode */
    ENV_TIMEOUT,          /* no reply within the timeout */
    ENV_N_FAULTS
} EnvFault;
extern const char *const ENV_FAULT_NAMES[ENV_N_FAULTS];   /* "ok", "bad_reply", "wrong_episode", "timeout" */

typedef struct {
    char *text;           /* reset: "observation"; step: "environment_feedback" (malloc'd; "" when absent or
                             on a fault); the caller frees it */
    double reward;        /* step: "reward" (0 when absent: a reward may come only when done; 0 on a fault) */
    int done;             /* step: "done" (1 on a fault: the episode ends) */
    EnvFault fault;
} EnvReply;

typedef struct Env Env;

/* Opens the environment: cmd (a program) or url (a server), exactly one non-NULL. timeout_s: per call,
 * the longest wait for a reply (0 = no limit). NULL and a one-line message in err when it cannot
 * start. Call from the main thread of one rank (the generating role's root). */
Env *env_open(const char *cmd, const char *url, double timeout_s, char *err, size_t errlen);
/* n resets: episode (n) ids, prompt_line (n) each its prompt's line as JSON text. Writes reply (n).
 * Returns 0 (per-episode faults in reply[i].fault), or -1 with a one-line message in err naming the
 * program / URL and what went wrong (the program exited, with its status, or closed its output; no
 * server answered any request). */
int env_reset(Env *e, int n, const int *episode, const char *const *prompt_line, EnvReply *reply, char *err,
              size_t errlen);
/* n steps: episode (n), turn (n) (1-based), action (n) the model's text of this turn, action_ids (n)
 * with n_ids (n) its token ids. Writes reply (n); returns as env_reset. */
int env_step(Env *e, int n, const int *episode, const int *turn, const char *const *action,
             const int *const *action_ids, const int *n_ids, EnvReply *reply, char *err, size_t errlen);
/* Replies dropped so far (a program's): lines naming an episode asked about earlier that is not
 * waiting now (a late reply after a timeout, a second reply), echoing another "turn" than the one
 * asked, or read when no episode of a call was waiting. For a metric; 0 for a server. */
long env_dropped(const Env *e);
/* The last call's first fault, one line: "episode E: <fault name>: <the line or the HTTP failure,
 * cut to 200 bytes>"; "" when the call had none. For a log line; valid until the next call. */
const char *env_fault_detail(const Env *e);
/* Stops the program (closes its stdin, waits, kills it after 5 s) or the client; frees. NULL: no-op. */
void env_close(Env *e);
#endif
