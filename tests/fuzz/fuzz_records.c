/* fuzz_records.c — libFuzzer harness: SFT records and preference pairs, read through data_open
 * (train/records.c: jsonl or a JSON array, every record format, the bad-record and over-long
 * policies) and then batched once through (train/data.c).
 * Input: byte 0 chooses the settings, byte 1 the sequence length (2 + byte), the rest is the file.
 *   bit 0 preference pairs   bit 1 skip bad records   bit 2 pairs as chat   bit 3 train on prompt
 *   bit 4 drop over-long     bit 5 the minimind BPE tokenizer (else stories260K's SentencePiece)
 *   bits 6-7 chat template: the tokenizer's own, chatml, llama2, llama3
 * Invariants: every kept sample fits seq_len with ids in the vocabulary; pairs come two by two with
 * a finite margin. */
#include "tests/fuzz/harness.h"
#include "train/data.h"
#include <math.h>

static Tokenizer *tok[2];


int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    fuzz_tokenizers(tok);
    if (n < 2) return 0;
    FUZZ_CATCH_USER_ERROR();
    static const char *templates[] = {NULL, "chatml", "llama2", "llama3"};
    uint8_t b = data[0];
    DataConfig c;
    data_config_default(&c);
    c.preference = b & 1;
    c.skip_bad_records = (b >> 1) & 1;
    c.pairs_as_chat = (b >> 2) & 1;
    c.train_on_prompt = (b >> 3) & 1;
    c.overlong = (b >> 4) & 1 ? OVERLONG_DROP : OVERLONG_TRUNCATE;
    c.chat_template = templates[b >> 6];
    c.seq_len = 2 + data[1];
    c.batch_size = 4;
    Tokenizer *t = tok[(b >> 5) & 1];
    Data d;
    data_open(&d, fuzz_as_file(data + 2, n - 2), t, &c);
    FUZZ_ASSERT(!c.preference || d.n_samples % 2 == 0);
    int vocab = tokenizer_vocab_size(t);
    for (int i = 0; i < d.n_samples; i++) {
        const int32_t *ids;
        int len = data_sample(&d, i, &ids, NULL);
        FUZZ_ASSERT(len >= 1 && len <= c.seq_len);
        for (int k = 0; k < len; k++) FUZZ_ASSERT(ids[k] >= 0 && ids[k] < vocab);
    }
    if (c.preference)
        for (int i = 0; i < d.n_samples / 2; i++) FUZZ_ASSERT(isfinite(d.margin[i]));
    DataBatch batch;
    while (data_next_batch(&d, &batch)) FUZZ_ASSERT(batch.n_tokens <= data_max_batch_tokens(&d));
    data_free(&d);
    return 0;
}
