/* episode.h — multi-turn rollouts against an environment (--env-cmd / --env-url, rlhf/env.h): the
 * rollout of a step when the ExperienceMaker has an environment. Per episode (one sample of one
 * prompt):
 *   reset   the environment's observation, tokenised once on its own, follows the prompt
 *   turns   the whole context so far (prompt ++ observation ++ earlier turns and feedback, as ids)
 *           goes to the actor's engine as one sequence's prompt; the model's turn ends at EOS, a
 *           --stop-token-ids id or a --stop string (part of the action), or after --max-new-tokens
 *   step    the environment sees the turn's text and ids; its reward of turn t lands at turn t's
 *           last action (Experience.turn_r); its feedback, tokenised once on its own (or rendered
 *           as a user message of the chat template: --env-chat-template), is appended as ids
 * until the environment says done, --max-turns turns, or --max-episode-tokens tokens after the
 * prompt (the model's and the environment's together). Nothing is re-tokenised: the ids the model
 * conditioned on are the ids trained on. An episode's reply that is a fault (rlhf/env.h EnvFault)
 * ends it with every turn's reward 0; an environment that fails as a whole stops the run
 * (rank_error naming it).
 * Placement: the environment is opened and called by the actor's root (mesh rank 0) only; what
 * the actor's other ranks need (observations, feedback ids, rewards, ends) is broadcast over the
 * actor's mesh.group, each turn's tokens are summed over its dp replicas, and the finished
 * episodes go to every rank of the world as the one-turn rollout's results do (roles_share_*).
 * Seeds: turn t of sample s of draw d at step k samples with splitmix64 of (seed, k, s, d, t).
 * Episode ids: (k * draws + d) * S + s, draws = --max-sample-draws with --dynamic-sampling, else 1:
 * unique over the run and the same on a resumed run.
 * Owns: the episode loop and its packing into an Experience. Does not own: the protocol
 * (rlhf/env.c), the rewards' use (rlhf/experience.c). */
#ifndef TANDEM_EPISODE_H
#define TANDEM_EPISODE_H
#include "rlhf/experience.h"

/* With --env-cmd / --env-url: chat (--env-chat-template) resolves x->env_chat from the tokenizer's
 * template or the name chat_template (--chat-template), a user error when there is none; then the
 * environment opens on the actor's root (an error naming the program / URL when it cannot start). */
void episode_env_open(ExperienceMaker *x, const Roles *rs, int chat, const char *chat_template);
/* The episodes of the B prompts pidx x G samples at `step` into b (experience_rollout's contract;
 * every rank of the world calls it). */
void episode_rollout(ExperienceMaker *x, const Roles *rs, int step, const int *pidx, Experience *b);
/* The environment's id of sample s at `step` (draw x->draw). */
int episode_id(const ExperienceMaker *x, int step, int s);
#endif
