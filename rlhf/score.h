/* score.h — `tandem rm --score` (rlhf/score.c): a reward model's score of each line of a jsonl. */
#ifndef TANDEM_SCORE_H
#define TANDEM_SCORE_H
#include "runtime/session.h"

/* Scores every line of input ({"prompt","response"}, {"text"} or {"messages"}) with the reward
 * model mo->dir (mo->score_head set; a sequence-classification --adapter may bring the head) and
 * writes them to output in input order with "reward" (and "reward_normalized" when the model has
 * saved statistics). A line longer than --seq-len or the model's max_position_embeddings keeps its
 * last tokens (after BOS), and the run says how many were cut. batch_size lines per forward. After
 * comm_init; calls comm_finalize. Returns 0. */
int rm_score_main(ModelOpen *mo, const char *input, const char *output, const char *chat_template, int seq_len,
               int batch_size);
#endif
