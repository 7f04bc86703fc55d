/* generate.h — `tandem generate`: offline batch generation from jsonl; and the prompt reader it
 * shares with `tandem ppo`. */
#ifndef TANDEM_GENERATE_H
#define TANDEM_GENERATE_H
#include "tokenizer/tokenizer.h"
#include <cjson/cJSON.h>

int generate_main(int argc, char **argv);

/* One jsonl line's prompt ids into t: "input_ids" (ids in [0, vocab)), "messages" (the chat
 * template with the generation prompt), or the text field `key` (BOS per the tokenizer unless
 * no_bos). Bad or missing fields are a user_error naming FILE:LINE. Returns the field as given, as
 * JSON text (malloc'd). tok may be NULL (then only input_ids work). */
char *prompt_tokens(Tokenizer *tok, const cJSON *j, const char *key, const char *chat_template, int no_bos, int vocab,
                    const char *file, int line, TokIds *t);
#endif
