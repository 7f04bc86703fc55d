/* fuzz_prompts.c — libFuzzer harness: prompt lines, as `tandem generate` reads them (requests_open / requests_next:
 * generate/request.c, every per-line field) and as `tandem ppo` reads its prompts
 * (experience_read_prompts: rlhf/experience.c, with prompt_tokens, prompt_fit and labels).
 * Input: byte 0 chooses the settings, the rest is the jsonl file.
 *   bit 0 ppo's reader (else generate's)   bit 1 the minimind BPE tokenizer (else stories260K's)
 *   bit 2 --truncate   bit 3 no tokenizer (input_ids only)   bits 4-5 chat template: the
 *   tokenizer's own, chatml, llama2, llama3
 * The model has 64 positions; max_new_tokens is 16 unless a line says otherwise. Invariants: every
 * prompt has at least one id, all in the vocabulary, and prompt + max_new fits the positions. */
#include "tests/fuzz/harness.h"
#include "generate/request.h"
#include "rlhf/experience.h"

enum { MAX_POS = 64, MAX_NEW = 16 };
static Tokenizer *tok[2];


static void check_prompt(const int *ids, size_t n, int max_new, int vocab) {
    FUZZ_ASSERT(n >= 1 && n + (size_t)max_new <= MAX_POS);
    for (size_t k = 0; k < n; k++) FUZZ_ASSERT(ids[k] >= 0 && ids[k] < vocab);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    fuzz_tokenizers(tok);
    if (n < 1) return 0;
    FUZZ_CATCH_USER_ERROR();
    static const char *templates[] = {NULL, "chatml", "llama2", "llama3"};
    uint8_t b = data[0];
    Tokenizer *t = (b >> 3) & 1 ? NULL : tok[(b >> 1) & 1];
    int truncate = (b >> 2) & 1, vocab = t ? tokenizer_vocab_size(t) : 512;
    const char *chat = templates[(b >> 4) & 3];
    const char *path = fuzz_as_file(data + 1, n - 1);
    if (b & 1) {
        ExperienceMaker x = {.tok = t, .B = 1, .G = 1, .max_new = MAX_NEW};
        experience_read_prompts(&x, path, "prompt", chat, truncate, vocab, MAX_POS);
        for (int i = 0; i < x.n_prompts; i++) {
            check_prompt(x.prompts[i].ids, x.prompts[i].n, MAX_NEW, vocab);
            tok_ids_free(&x.prompts[i]);
            free(x.prompt_text[i]);
            free(x.labels[i]);
        }
        free(x.prompts), free(x.prompt_text), free(x.labels), free(x.prompt_line);
        return 0;
    }
    ModelConfig cfg = {.vocab_size = vocab, .max_pos = MAX_POS};
    RequestDefaults d = {.max_new = MAX_NEW, .key = "prompt", .chat_template = chat, .truncate = truncate};
    sampling_params_default(&d.sp);
    int eos[1] = {t ? tokenizer_eos_id(t) : 2};
    RequestReader rr;
    requests_open(&rr, path, &d, t, &cfg, eos, eos[0] >= 0);
    for (Request r; requests_next(&rr, &r);) {
        check_prompt(r.seq.prompt, (size_t)r.seq.n_prompt, r.seq.max_new, vocab);
        FUZZ_ASSERT(r.seq.max_new >= 1 && r.seq.min_new <= r.seq.max_new);
        request_free(&r);
    }
    requests_close(&rr);
    return 0;
}
