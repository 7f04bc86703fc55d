/* experience.h — one PPO step's experience: the prompts of the step, the actor's rollout, the
 * reference / reward / critic passes and the advantages, and its mini-batches for the updates.
 *   1. rollout     actor: each dp replica samples its share of the batch on the live training
 *                  shards (generate/engine.c); results to every rank
 *   2. passes      ref and teacher: logprobs at the temperature; reward: the score at each sequence's last token
 *                  (reward model) or the reward program (world rank 0); critic: values. Each
 *                  role's root broadcasts its results over the world (rlhf/roles.h)
 *   3. advantages  every rank, identically (rlhf/ppo_loss.c): KL-penalised token rewards + GAE and
 *                  whitening, or their discounted returns whitened (REINFORCE++), or GRPO / RLOO /
 *                  REINFORCE++-baseline group advantages
 * and, for step 4 (the updates, rlhf/ppo.c), the repacking of chosen sequences into micro-batches
 * with their hook contexts. Every rank runs the same control flow (the same collectives in the
 * same order).
 * Owns: Experience (the batch, the same on every rank), ExperienceMaker (what making it needs:
 * prompts, sampling, stops, the reward program, the advantage settings).
 * Does not own: placement (roles.h), the updates and their optimizers (ppo.c, train/learner.h),
 * the loss math (ppo_loss.h). */
#ifndef TANDEM_EXPERIENCE_H
#define TANDEM_EXPERIENCE_H
#include "generate/engine.h"
#include "rlhf/env.h"
#include "rlhf/ppo_loss.h"
#include "rlhf/reward_cmd.h"
#include "rlhf/roles.h"
#include "rlhf/verify.h"
#include "tokenizer/tokenizer.h"
#include "train/grad.h"

/* The batch of one step, the same on every rank: S sequences (prompt ++ response) packed back to
 * back. Actions are the positions before each response token. */
typedef struct {
    int S, N;
    int *tokens, *seq_start, *targets;   /* (N), (S + 1), (N): targets[n] = tokens[n + 1] at actions, else -1 */
    int *prompt_len, *resp_len, *finish; /* (S) */
    float *mask;                         /* (N) 1 at actions (0 at --mask-truncated's, after the advantages) */
    float *old_lp, *ref_lp, *values;     /* (N) at actions; ref_lp NULL without a reference */
    float *teacher_lp;                   /* (N) at actions: the teacher's logprobs (--teacher); NULL without */
    double teacher_kl;                   /* the step's mean reverse KL estimate to the teacher (rlhf/distill.h) */
    double *score;                       /* (S) the reward (after normalising / penalty / clipping) */
    double *raw;                         /* (S) the reward model's or program's score, before shaping */
    int *draw;                           /* (S) --dynamic-sampling: the draw that sampled it (0: the step's own) */
    int n_timed_out;                     /* --reward-fn: samples whose verification ran past its timeout */
    /* --env-cmd / --env-url (rlhf/episode.h): the sequence after the prompt is an episode, the model's
     * turns and the environment's tokens (observation, feedback) in order. Filled by the rollout. */
    int *turn;                           /* (N) the turn of each token after the prompt: the model's of turn t, or
                                            the environment's answering turn t (0: the observation); 0 at the prompt */
    double *turn_r;                      /* (N) the environment's reward of turn t at turn t's last action, else 0 */
    int *turns, *fault;                  /* (S) the model's turns; the EnvFault that ended the episode (0: none) */
    double *rewards, *kl, *adv, *ret;    /* (N) */
    float *adv_f, *ret_f;                /* (N) float copies for the hooks */
} Experience;

typedef struct {
    /* prompts, tokenized on every rank */
    int n_prompts;
    const char *prompts_path;            /* the --prompts file */
    int *prompt_line;                    /* (n_prompts) each prompt's line in it */
    TokIds *prompts;
    char **prompt_text, **labels;        /* decoded prompt; label JSON text or NULL */
    cJSON **refs;                        /* --reward-fn: each prompt line (its "answer" / "tests"), else NULL */
    char **prompt_id;                    /* the line's "id" as JSON text, or NULL */
    char **lines;                        /* with an environment: each prompt line as JSON text (its reset's
                                            "prompt"); else NULL */
    Tokenizer *tok;
    /* rollout */
    int B, G, max_new, max_len;          /* prompts per step, samples per prompt, response and sequence length at most */
    int *stop_ids, n_stop_ids;           /* the EOS ids (generate's rule: eos_ids_load) and --stop-token-ids:
                                            a response ends at any of them */
    char **stops;                        /* --stop strings: a response ends with the token that completes one */
    int n_stops;
    TokStream *ts;                       /* (S) per sequence: its response decoded so far */
    char **txt;
    size_t *tlen, *tcap;
    SamplingParams sp;
    uint64_t seed;
    int draw;                            /* the step's draw being sampled (--dynamic-sampling; 0 otherwise):
                                            sample s of draw d has seed index s + d S */
    int dynamic_sampling, max_draws;     /* DAPO: drop groups of equal rewards, draw again, at most max_draws */
    int overlong_buffer;                 /* DAPO's overlong shaping: the buffer L (0 = off) and factor F */
    double overlong_factor;
    int mask_truncated;                  /* responses cut at --max-new-tokens weigh 0 in the loss */
    /* multi-turn episodes (rlhf/episode.h): on when env_cmd or env_url is set */
    const char *env_cmd, *env_url;       /* --env-cmd / --env-url */
    Env *env;                            /* open on the actor's root only (NULL elsewhere) */
    double env_timeout;                  /* --env-timeout: seconds per call */
    int max_turns, max_ep_tokens;        /* --max-turns, --max-episode-tokens (tokens after the prompt) */
    int env_chat;                        /* --env-chat-template: the ChatFormat feedback is rendered in, else -1 */
    Engine *engine;                      /* the actor's, on its training shards (actor ranks) */
    /* forward-only passes */
    int fwd_tokens;                      /* tokens per forward-only chunk */
    /* the reward program */
    RewardCmd *rcmd;
    const char *reward_cmd;
    char **urls;                         /* --reward-url: OpenRLHF-style reward servers */
    int n_urls, reward_retries;
    double reward_timeout;
    int reward_fn, reward_workers;       /* --reward-fn: a built-in verifier (rlhf/verify.h) of kind verify_kind */
    VerifyKind verify_kind;
    double fn_timeout;                   /* its seconds per sample */
    /* advantages */
    KlEstimator kl_est;
    AdvantageKind adv_kind;
    double reward_clip, eos_penalty, gamma, lambda;
    int std_norm, whiten;
    int lora_ref;             /* the reference is the actor's base with its LoRA adapters off (no --ref model) */
    double distill_coef;                 /* --teacher: the distillation term's weight in the advantage (rlhf/distill.h) */
    int has_norm;                        /* --normalize-reward with the reward model's saved stats */
    double norm_mean, norm_std;
} ExperienceMaker;

/* The tokens after a prompt at most: --max-episode-tokens with an environment, else --max-new-tokens. */
static inline int experience_resp_max(const ExperienceMaker *x) {
    return x->env_cmd || x->env_url ? x->max_ep_tokens : x->max_new;
}

/* Reads the prompts (jsonl: "prompt" | "messages" | "input_ids", optional "label") on every rank;
 * a prompt longer than max_pos - max_new is an error, or keeps its last tokens with truncate; a
 * line longer than jsonl_max_bytes(max_pos) is an error before it is tokenized. */
void experience_read_prompts(ExperienceMaker *x, const char *path, const char *key, const char *chat_template,
                             int truncate, int vocab, int max_pos);
/* The prompts of step `step` (0-based), B indices: a fresh shuffle (seeded) per pass over the file. */
void experience_step_prompts(const ExperienceMaker *x, int step, int *pidx);
/* What ends a response: the EOS ids by generate's rule (generate/request.h eos_ids_load: config.json,
 * generation_config.json, the tokenizer), --stop-token-ids (comma-separated) and --stop strings (one,
 * or a JSON list); either flag may be NULL. user_error naming the flag on a bad value. */
void experience_stops(ExperienceMaker *x, const char *model_dir, const ModelConfig *cfg, const char *stop_json,
                      const char *stop_ids);
/* Frees what the maker holds: prompts, tokenizer, stops, the reward program (stopped) and the engine. */
void experience_maker_free(ExperienceMaker *x);
/* "L1, L2, ..." the --prompts lines of a step's B prompts pidx (16 at most, then their count), for
 * error lines. */
void experience_prompt_lines(const ExperienceMaker *x, const int *pidx, char *buf, size_t len);
/* The engine's per-token callback for --stop strings (ctx: the ExperienceMaker). */
int experience_stop_on_token(void *ctx, Seq *q);

void experience_alloc(Experience *b, int S, int max_len, int with_ref);
void experience_free(Experience *b);
/* Appends sequence s of src to dst (dst->S = 0, N = 0: empty): what the rollout and the reward
 * fill (tokens, targets, mask, old logprobs, lengths, finish, score, draw). */
void experience_append(Experience *dst, const Experience *src, int s);

/* 1. rollout of the B prompts pidx x G samples at `step` (seeds are functions of seed and step) */
void experience_rollout(ExperienceMaker *x, const Roles *rs, int step, const int *pidx, Experience *b);
/* 2. the passes; each leaves its result on every rank */
void experience_ref(ExperienceMaker *x, Roles *rs, Experience *b);
/* The teacher's logprobs at the temperature, as the reference's (same chunks, same sharing), into
 * b->teacher_lp (allocated by the caller); nothing without a teacher. */
void experience_teacher(ExperienceMaker *x, Roles *rs, Experience *b);
/* The reward: the program's (reward_cmd.h, reward_http.h) or the reward model's score, which is
 * held to the same bound (REWARD_ABS_MAX) or stops the run naming the sample and its prompt. */
void experience_reward(ExperienceMaker *x, Roles *rs, Experience *b, const int *pidx);
void experience_values(ExperienceMaker *x, Roles *rs, Experience *b);
/* The shaped score of sample s of b from its raw score: normalised (--normalize-reward), plus the
 * overlong penalty (DAPO, verl's overlong_buffer: with Lmax = max_new and n = resp_len[s],
 * min(-(n - (Lmax - L)) / L * F, 0)), minus the missing-EOS penalty, clipped (--reward-clip).
 * overlong, eos (may be NULL): the two penalties as added (<= 0). */
double experience_shape_score(const ExperienceMaker *x, const Experience *b, int s, double raw, double *overlong, double *eos);
/* --mask-truncated: the actions of responses that did not end at a stop (EOS, stop id or string)
 * get mask 0: out of the loss (weight 0, and not in the token-mean's count), after the advantages
 * (their scores still count in their group's statistics, as TRL's mask_truncated_completions). */
void experience_mask_truncated(Experience *b);
/* 3. score shaping, token rewards (KL penalty kl_coef for gae), advantages and returns, and with a
 * teacher the distillation term added to the advantages (rlhf/distill.h; b->teacher_kl); returns
 * the sum of the raw scores (kept in b->raw; b->score becomes the shaped ones). An advantage or return that is not finite (as a float) stops the run
 * (user_error naming step, 0-based, and the sample and its prompt pidx). */
double experience_advantages(const ExperienceMaker *x, Experience *b, double kl_coef, int step, const int *pidx);

/* 4. Mini-batch sequences perm[k0 .. k0 + mini) of b, this dp replica's share (every dp-th), as
 * micro-batches of at most `micro` sequences, each action weighted by loss_agg_weight (mb->agg over
 * the whole mini-batch, times dp; so the loss is the same at any dp and micro-batch size): the actor's (old logprobs, ref logprobs, advantages; check_logprobs on the
 * first mini-batch of a step) or the critic's (old values, returns) hook contexts. The buffers are
 * Minibatch's, sized by minibatch_alloc. Returns the number of micro-batches. */
typedef struct {
    int micro, cap;              /* sequences and tokens per micro-batch at most */
    LossAgg agg;                 /* the aggregation (0: token-mean) and seq-mean-token-sum-norm's constant */
    int agg_norm;
    MicroBatch *mbs;             /* (max_mb) */
    PpoCtx *ctx;                 /* (max_mb) */
    int *tok, *tgt, *st;         /* (max_mb, cap), (max_mb, cap), (max_mb, micro + 1) */
    float *fl;                   /* (max_mb, 5, cap): weight, then the hook's columns */
} Minibatch;
void minibatch_alloc(Minibatch *mb, int max_mb, int micro, int max_len);
void minibatch_free(Minibatch *mb);
int experience_minibatch(const Experience *b, const int *perm, int k0, int mini, int dp, int dp_rank, int actor,
                         int check_logprobs, Minibatch *mb);
#endif
