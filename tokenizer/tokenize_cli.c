/* tokenize_cli.c — `tandem tokenize`: text <-> token ids on stdin/stdout, one record per line.
 *   plain:   text line -> "id id id"           (--decode: "id id id" -> text line)
 *   --jsonl: {"text"} -> {"input_ids"}          (--decode: {"input_ids"} -> {"text"})
 *            {"messages": [{"role","content"}]} -> {"input_ids","mask"} via the chat template
 * Bad input stops with one line "tandem: stdin:LINE: ..." and exit code 1; output already written
 * for earlier lines stays (it is a stream). This file owns only flag and record handling. */
#include "tokenizer/tokenize_cli.h"
#include "tokenizer/tokenizer.h"
#include "runtime/args.h"
#include "runtime/jsonl.h"
#include "runtime/util.h"
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *model, *tokenizer, *chat_template;
    int decode, jsonl, no_bos, add_eos, gen_prompt, skip_special;
} TokenizeArgs;

/* the option table (runtime/args.h): parsing, defaults and --help come from it */
static void parse_args(int argc, char **argv, TokenizeArgs *a) {
    Option opts[] = {
        {"--model", OPT_MODEL, &a->model, NULL, "HF model dir (tokenizer.model or tokenizer.json + configs)"},
        {"--tokenizer", OPT_STR, &a->tokenizer, NULL, "tokenizer.model (SentencePiece) or tokenizer.json (HF BPE)"},
        {"--decode", OPT_FLAG, &a->decode, NULL, "ids -> text"},
        {"--jsonl", OPT_FLAG, &a->jsonl, NULL, "JSON lines: {\"text\"} | {\"input_ids\"} | {\"messages\"}"},
        {"--no-bos", OPT_FLAG, &a->no_bos, NULL, "do not add BOS (default: as the tokenizer's config says)"},
        {"--add-eos", OPT_FLAG, &a->add_eos, NULL, "append EOS"},
        {"--chat-template", OPT_STR, &a->chat_template, NULL,
         "llama2 | mistral | chatml | chatml-think | llama3 | qwen3 | qwen3-nothink (default: recognised from tokenizer_config.json)"},
        {"--add-generation-prompt", OPT_FLAG, &a->gen_prompt, NULL, "end rendered chats with the assistant header"},
        {"--skip-special-tokens", OPT_FLAG, &a->skip_special, NULL, "decode without special tokens (<s>, <|im_end|>, ...)"},
    };
    args_parse("usage: tandem tokenize (--model DIR | --tokenizer FILE) [options] < input", opts,
               (int)(sizeof(opts) / sizeof(opts[0])), argc, argv);
    if (!a->model == !a->tokenizer) user_error("tokenize: give exactly one of --model DIR or --tokenizer FILE");
}

/* "12 7 99" -> ids; user_error on anything that is not an id of this vocabulary. */
static void parse_id_line(const Tokenizer *t, char *line, long lineno, TokIds *ids) {
    char *p = line;
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == '\r') p++;
        if (!*p) break;
        errno = 0;
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || errno || (*end && *end != ' ' && *end != '\t' && *end != '\r'))
            user_error("stdin:%ld: \"%.*s\" is not a token id", lineno, (int)strcspn(p, " \t\r"), p);
        if (v < 0 || v >= tokenizer_vocab_size(t))
            user_error("stdin:%ld: token id %ld out of range (vocab size %d)", lineno, v, tokenizer_vocab_size(t));
        tok_ids_push(ids, (int32_t)v);
        p = end;
    }
}

/* "12 7 99\n" without printf: the CLI is often run over whole corpora. */
static void print_id_line(const TokIds *v) {
    static char *buf;
    static size_t cap;
    if (cap < v->n * 12 + 2) { cap = v->n * 12 + 64; buf = xrealloc(buf, cap); }
    size_t n = 0;
    for (size_t i = 0; i < v->n; i++) {
        char tmp[12];
        int k = 0;
        uint32_t x = (uint32_t)v->ids[i]; /* ids are non-negative */
        do { tmp[k++] = (char)('0' + x % 10); x /= 10; } while (x);
        if (i) buf[n++] = ' ';
        while (k) buf[n++] = tmp[--k];
    }
    buf[n++] = '\n';
    fwrite(buf, 1, n, stdout);
}

static cJSON *ids_to_json(const TokIds *v) {
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; i < v->n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(v->ids[i]));
    return a;
}

static void print_json(cJSON *o) {
    char *s = cJSON_PrintUnformatted(o);
    CHECK(s != NULL);
    fputs(s, stdout);
    fputc('\n', stdout);
    free(s);
}

/* One {"text"} | {"input_ids"} | {"messages"} object of stdin line lineno. chat_format < 0: no chat
 * format could be resolved, and chat_err says why (reported only if a line has messages). */
static void jsonl_line(Tokenizer *t, const TokenizeArgs *a, int chat_format, const char *chat_err, cJSON *in,
                       long lineno, unsigned enc_flags) {
    cJSON *out = cJSON_CreateObject();
    TokIds ids = {0}, mask = {0};
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(in, "text");
    const cJSON *in_ids = cJSON_GetObjectItemCaseSensitive(in, "input_ids");
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(in, "messages");
    if (a->decode) {
        if (!cJSON_IsArray(in_ids)) user_error("stdin:%ld: field \"input_ids\" missing or not an array", lineno);
        const cJSON *e;
        int k = 0;
        cJSON_ArrayForEach(e, in_ids) {
            if (!cJSON_IsNumber(e) || e->valuedouble != (double)e->valueint || e->valueint < 0 ||
                e->valueint >= tokenizer_vocab_size(t))
                user_error("stdin:%ld: input_ids[%d] is not a token id of this vocabulary (size %d)",
                           lineno, k, tokenizer_vocab_size(t));
            tok_ids_push(&ids, (int32_t)e->valueint);
            k++;
        }
        size_t len;
        char *s = tokenizer_decode(t, ids.ids, ids.n, a->skip_special, &len);
        cJSON_AddStringToObject(out, "text", s);
        free(s);
    } else if (cJSON_IsString(text)) {
        tokenizer_encode(t, text->valuestring, strlen(text->valuestring), enc_flags, &ids, NULL);
        cJSON_AddItemToObject(out, "input_ids", ids_to_json(&ids));
    } else if (cJSON_IsArray(msgs)) {
        int n = cJSON_GetArraySize(msgs);
        ChatMessage *m = xcalloc((size_t)n + 1, sizeof(ChatMessage));
        char err[512];
        if (chat_messages_parse(msgs, "messages", "role", "content", m, err, sizeof(err)) < 0)
            user_error("stdin:%ld: %s", lineno, err);
        if (chat_format < 0) user_error("%s", chat_err);
        if (chat_render(t, (ChatFormat)chat_format, m, n, a->gen_prompt, &ids, &mask, err, sizeof(err)))
            user_error("stdin:%ld: %s", lineno, err);
        free(m);
        cJSON_AddItemToObject(out, "input_ids", ids_to_json(&ids));
        cJSON_AddItemToObject(out, "mask", ids_to_json(&mask));
    } else {
        user_error("stdin:%ld: expected a field \"text\" (string) or \"messages\" (array)", lineno);
    }
    print_json(out);
    cJSON_Delete(out);
    cJSON_Delete(in);
    tok_ids_free(&ids);
    tok_ids_free(&mask);
}

int tokenize_main(int argc, char **argv) {
    TokenizeArgs a;
    parse_args(argc, argv, &a);
    char err[1024];
    Tokenizer *t = tokenizer_open(a.model ? a.model : a.tokenizer, err, sizeof(err));
    if (!t) user_error("%s", err);
    /* The chat format, resolved once: a bad name fails before any input is read; a tokenizer
     * without a recognised template fails only when a line has messages (plain text needs none). */
    char chat_err[512] = "";
    int chat_format = chat_format_resolve(t, a.chat_template, chat_err, sizeof(chat_err));
    if (chat_format < 0 && a.chat_template) user_error("%s", chat_err);
    unsigned enc_flags = (!a.no_bos && tokenizer_add_bos_default(t) ? TOK_ADD_BOS : 0) |
                         (a.add_eos ? TOK_ADD_EOS : 0);
    if (a.jsonl) {
        JsonlReader r;
        jsonl_attach(&r, stdin, "stdin");
        cJSON *in;
        while ((in = jsonl_next(&r))) jsonl_line(t, &a, chat_format, chat_err, in, r.line, enc_flags);
        jsonl_close(&r);
        tokenizer_free(t);
        if (fflush(stdout)) user_error("tokenize: cannot write output");
        return 0;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    long lineno = 0;
    TokIds ids = {0};
    while ((n = getline(&line, &cap, stdin)) >= 0) {
        lineno++;
        if (n > 0 && line[n - 1] == '\n') line[--n] = 0;
        ids.n = 0;
        if (a.decode) {
            parse_id_line(t, line, lineno, &ids);
            size_t len;
            char *s = tokenizer_decode(t, ids.ids, ids.n, a.skip_special, &len);
            fwrite(s, 1, len, stdout);
            fputc('\n', stdout);
            free(s);
        } else {
            tokenizer_encode(t, line, (size_t)n, enc_flags, &ids, NULL);
            print_id_line(&ids);
        }
    }
    free(line);
    tok_ids_free(&ids);
    tokenizer_free(t);
    if (fflush(stdout)) user_error("tokenize: cannot write output");
    return 0;
}
