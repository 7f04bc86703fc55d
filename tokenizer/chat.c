/* chat.c — chat templates without Jinja: recognise the common formats in a tokenizer_config.json
 * chat_template (or take a name), render messages as transformers' apply_chat_template does, and
 * mark the assistant tokens SFT trains on.
 *
 * Each format is a C function that appends text segments, each with a mask bit (1 = assistant
 * output: content and its end-of-turn token). The whole text is then encoded once (special tokens
 * in it are matched as in HF), and a token's mask is the mask of the byte where it starts.
 * Also the one reader of a JSON messages array (chat_messages_parse). This file does not execute
 * or parse Jinja, and reads no JSON file or line itself (its callers do). */
#include "tokenizer/tok_internal.h"
#include "runtime/util.h"
#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static const char *FORMAT_NAMES[] = {"llama2", "mistral", "chatml", "chatml-think", "llama3", "qwen3", "qwen3-nothink"};
#define KNOWN "llama2, mistral, chatml, chatml-think, llama3, qwen3, qwen3-nothink"

int chat_format_from_name(const char *name) {
    for (int i = 0; i < (int)(sizeof(FORMAT_NAMES) / sizeof(FORMAT_NAMES[0])); i++)
        if (!strcmp(name, FORMAT_NAMES[i])) return i;
    return -1;
}

const char *chat_format_name(ChatFormat f) { return FORMAT_NAMES[f]; }

int chat_format_detect(const char *tpl) {
    if (!tpl) return -1;
    if (strstr(tpl, "<|start_header_id|>") && strstr(tpl, "<|eot_id|>")) return CHAT_LLAMA3;
    if (strstr(tpl, "<|im_start|>") && strstr(tpl, "<|im_end|>")) {
        /* Qwen3's hybrid template: thinking by default, as transformers renders it without enable_thinking */
        if (strstr(tpl, "<think>") && strstr(tpl, "enable_thinking") && strstr(tpl, "last_query_index")) return CHAT_QWEN3;
        return strstr(tpl, "<think>") ? CHAT_CHATML_THINK : CHAT_CHATML;
    }
    if (strstr(tpl, "[INST]") && strstr(tpl, "[/INST]"))
        return strstr(tpl, "<<SYS>>") ? CHAT_LLAMA2 : CHAT_MISTRAL;
    return -1;
}

int chat_format_resolve(const Tokenizer *t, const char *name, char *err, size_t errlen) {
    if (name) {
        int f = chat_format_from_name(name);
        if (f < 0)
            snprintf(err, errlen, "unknown chat template \"%s\" (known: " KNOWN ")", name);
        return f;
    }
    if (!t->chat_template) {
        snprintf(err, errlen, "%s: no chat_template in tokenizer_config.json; pass --chat-template NAME (" KNOWN ")",
                 t->path);
        return -1;
    }
    int f = chat_format_detect(t->chat_template);
    if (f < 0)
        snprintf(err, errlen, "tokenizer_config.json: chat_template is not a known format (" KNOWN "); pass "
                 "--chat-template NAME");
    return f;
}

/* ---------------------------------------------------------------- text builder */

typedef struct {
    char *s;
    unsigned char *m;
    size_t n, cap;
} Builder;

static void put(Builder *b, const char *s, size_t n, int mask) {
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->s = xrealloc(b->s, b->cap);
        b->m = xrealloc(b->m, b->cap);
    }
    memcpy(b->s + b->n, s, n);
    memset(b->m + b->n, mask, n);
    b->n += n;
    b->s[b->n] = 0;
}
static void puts0(Builder *b, const char *s) { put(b, s, strlen(s), 0); }
static void puts1(Builder *b, const char *s) { put(b, s, strlen(s), 1); }

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

/* Python str.strip() / lstrip / rstrip over chars in set (ASCII whitespace when set is NULL). */
static void strip_span(const char **s, size_t *n, int left, int right, const char *set) {
    while (left && *n && (set ? strchr(set, **s) != NULL : is_ws(**s))) { (*s)++; (*n)--; }
    while (right && *n && (set ? strchr(set, (*s)[*n - 1]) != NULL : is_ws((*s)[*n - 1]))) (*n)--;
}

static int role_is(const ChatMessage *m, const char *r) { return !strcmp(m->role, r); }

static int fail(char *err, size_t errlen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

/* ---------------------------------------------------------------- formats */

/* meta-llama/Llama-2-*-chat: the system prompt is folded into the first user turn. */
static int render_llama2(const Tokenizer *t, Builder *b, const ChatMessage *msgs, int n, char *err, size_t errlen) {
    const char *bos = t->bos_id >= 0 ? t->pieces[t->bos_id] : NULL;
    const char *eos = t->eos_id >= 0 ? t->pieces[t->eos_id] : NULL;
    if (!bos || !eos) return fail(err, errlen, "llama2 chat template needs bos and eos tokens");
    const char *sys = NULL;
    if (n > 0 && role_is(&msgs[0], "system")) { sys = msgs[0].content; msgs++; n--; }
    for (int i = 0; i < n; i++) {
        int user = role_is(&msgs[i], "user");
        if (!user && !role_is(&msgs[i], "assistant"))
            return fail(err, errlen, "messages[%d]: role \"%s\" is not supported by the llama2 template", i + (sys != NULL), msgs[i].role);
        if (user != (i % 2 == 0))
            return fail(err, errlen, "messages[%d]: conversation roles must alternate user/assistant/user/assistant/...", i + (sys != NULL));
        char *content = NULL;
        const char *c = msgs[i].content;
        if (i == 0 && sys) {
            size_t len = strlen(sys) + strlen(c) + 32;
            content = xmalloc(len);
            snprintf(content, len, "<<SYS>>\n%s\n<</SYS>>\n\n%s", sys, c);
            c = content;
        }
        size_t cn = strlen(c);
        strip_span(&c, &cn, 1, 1, NULL);
        if (user) {
            puts0(b, bos);
            puts0(b, "[INST] ");
            put(b, c, cn, 0);
            puts0(b, " [/INST]");
        } else {
            puts1(b, " ");
            put(b, c, cn, 1);
            puts1(b, " ");
            puts1(b, eos);
        }
        free(content);
    }
    return 0;
}

/* mistralai/Mistral-7B-Instruct-v0.1/v0.2: user/assistant only. */
static int render_mistral(const Tokenizer *t, Builder *b, const ChatMessage *msgs, int n, char *err, size_t errlen) {
    const char *bos = t->bos_id >= 0 ? t->pieces[t->bos_id] : NULL;
    const char *eos = t->eos_id >= 0 ? t->pieces[t->eos_id] : NULL;
    if (!bos || !eos) return fail(err, errlen, "mistral chat template needs bos and eos tokens");
    puts0(b, bos);
    for (int i = 0; i < n; i++) {
        int user = role_is(&msgs[i], "user");
        if (user != (i % 2 == 0) && (user || role_is(&msgs[i], "assistant")))
            return fail(err, errlen, "messages[%d]: conversation roles must alternate user/assistant/user/assistant/...", i);
        if (user) {
            puts0(b, "[INST] ");
            puts0(b, msgs[i].content);
            puts0(b, " [/INST]");
        } else if (role_is(&msgs[i], "assistant")) {
            puts1(b, msgs[i].content);
            puts1(b, eos);
        } else {
            return fail(err, errlen, "messages[%d]: role \"%s\": the mistral template supports only user and assistant roles", i, msgs[i].role);
        }
    }
    return 0;
}

/* ChatML. Qwen2's template adds a default system turn when the first message is not one. */
static int render_chatml(const Tokenizer *t, Builder *b, const ChatMessage *msgs, int n, int gen) {
    for (int i = 0; i < n; i++) {
        if (i == 0 && t->chatml_default_system && !role_is(&msgs[0], "system"))
            puts0(b, "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n");
        int asst = role_is(&msgs[i], "assistant");
        puts0(b, "<|im_start|>");
        puts0(b, msgs[i].role);
        puts0(b, "\n");
        put(b, msgs[i].content, strlen(msgs[i].content), asst);
        put(b, "<|im_end|>", 10, asst);
        puts0(b, "\n");
    }
    if (gen) puts0(b, "<|im_start|>assistant\n");
    return 0;
}

/* An assistant content with a "</think>" split as the Qwen3-family templates split it:
 *   reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n')
 *   content   = content.split('</think>')[-1].lstrip('\n')
 * Without one: reasoning "" and the content as is. Spans point into s. Returns 1 when split. */
static int split_think(const char *s, const char **r, size_t *rn, const char **c, size_t *cn) {
    const char *end_think = strstr(s, "</think>"), *q;
    *r = "";
    *rn = 0;
    *c = s;
    *cn = strlen(s);
    if (!end_think) return 0;
    *r = s;
    *rn = (size_t)(end_think - s);
    strip_span(r, rn, 0, 1, "\n");
    const char *p = *r; /* text after the last "<think>" */
    while ((q = memmem(p, *rn - (size_t)(p - *r), "<think>", 7))) p = q + 7;
    *rn -= (size_t)(p - *r);
    *r = p;
    strip_span(r, rn, 1, 0, "\n");
    const char *last = end_think;
    while ((q = strstr(last + 8, "</think>"))) last = q;
    *c = last + 8;
    *cn = strlen(*c);
    strip_span(c, cn, 1, 0, "\n");
    return 1;
}

/* A prompt-side ChatML turn (mask 0): <|im_start|>ROLE\nCONTENT<|im_end|>\n. */
static void im_turn(Builder *b, const char *role, const char *content) {
    puts0(b, "<|im_start|>");
    puts0(b, role);
    puts0(b, "\n");
    puts0(b, content);
    puts0(b, "<|im_end|>\n");
}

/* An assistant's think block <think>\nREASONING\n</think>\n\n: output (mask 1) when it holds
 * reasoning, prompt when empty (what a non-thinking generation prompt writes). */
static void think_block(Builder *b, const char *r, size_t rn) {
    put(b, "<think>\n", 8, rn > 0);
    put(b, r, rn, rn > 0);
    put(b, "\n</think>\n\n", 11, rn > 0);
}

/* MiniMind-2 / Qwen3-style ChatML: every assistant turn carries a <think> block, empty unless the
 * content has one. The generation prompt ends with the empty block, so an empty block is prompt
 * (mask 0) and a non-empty one is output (mask 1). */
static int render_chatml_think(Builder *b, const ChatMessage *msgs, int n, int gen, char *err, size_t errlen) {
    if (n > 0 && role_is(&msgs[0], "system")) {
        im_turn(b, "system", msgs[0].content);
    }
    for (int i = 0; i < n; i++) {
        const ChatMessage *m = &msgs[i];
        if (role_is(m, "user") || (role_is(m, "system") && i > 0)) {
            im_turn(b, m->role, m->content);
        } else if (role_is(m, "assistant")) {
            const char *c, *r;
            size_t cn, rn;
            split_think(m->content, &r, &rn, &c, &cn);
            strip_span(&r, &rn, 1, 1, "\n");
            strip_span(&c, &cn, 1, 0, "\n");
            puts0(b, "<|im_start|>assistant\n");
            think_block(b, r, rn);
            put(b, c, cn, 1);
            puts1(b, "<|im_end|>");
            puts0(b, "\n");
        } else if (!role_is(m, "system")) {
            return fail(err, errlen, "messages[%d]: role \"%s\" is not supported by the chatml-think template", i, m->role);
        }
    }
    if (gen) puts0(b, "<|im_start|>assistant\n<think>\n\n</think>\n\n");
    return 0;
}

static int is_tool_response(const char *s) {
    size_t n = strlen(s);
    return !strncmp(s, "<tool_response>", 15) && n >= 16 && !strcmp(s + n - 16, "</tool_response>");
}

/* Qwen3's hybrid template (Qwen/Qwen3-0.6B's tokenizer_config.json; the text is in
 * tests/fixtures/tokenizer/qwen3): ChatML where an assistant turn after the last user query (the last
 * "user" message that is not a <tool_response> wrapper) carries <think>\nreasoning\n</think>\n\n when
 * it is the last message or has reasoning, and the turns before it lose their reasoning; "tool"
 * messages are <tool_response> blocks, consecutive ones in one user turn. The generation prompt is
 * "<|im_start|>assistant\n", plus an empty think block with enable_thinking=False (nothink): the
 * non-thinking mode. Masks: an assistant's content and <|im_end|>, its think block when it holds
 * reasoning (an empty one is what the non-thinking prompt writes: prompt). */
static int render_qwen3(Builder *b, const ChatMessage *msgs, int n, int gen, int nothink, char *err, size_t errlen) {
    int last_query = n - 1;
    for (int i = n - 1; i >= 0; i--)
        if (role_is(&msgs[i], "user") && !is_tool_response(msgs[i].content)) { last_query = i; break; }
    for (int i = 0; i < n; i++) {
        const ChatMessage *m = &msgs[i];
        if (role_is(m, "user") || role_is(m, "system")) {
            im_turn(b, m->role, m->content);
        } else if (role_is(m, "assistant")) {
            const char *c, *r;
            size_t cn, rn;
            split_think(m->content, &r, &rn, &c, &cn);
            puts0(b, "<|im_start|>assistant\n");
            if (i > last_query && (i == n - 1 || rn > 0)) {
                think_block(b, r, rn);
                strip_span(&c, &cn, 1, 0, "\n");
            }
            put(b, c, cn, 1);
            puts1(b, "<|im_end|>");
            puts0(b, "\n");
        } else if (role_is(m, "tool")) {
            if (i == 0 || !role_is(&msgs[i - 1], "tool")) puts0(b, "<|im_start|>user");
            puts0(b, "\n<tool_response>\n");
            puts0(b, m->content);
            puts0(b, "\n</tool_response>");
            if (i == n - 1 || !role_is(&msgs[i + 1], "tool")) puts0(b, "<|im_end|>\n");
        } else {
            return fail(err, errlen, "messages[%d]: role \"%s\" is not supported by the qwen3 template", i, m->role);
        }
    }
    if (gen) puts0(b, nothink ? "<|im_start|>assistant\n<think>\n\n</think>\n\n" : "<|im_start|>assistant\n");
    return 0;
}

/* meta-llama/Meta-Llama-3-8B-Instruct. */
static int render_llama3(const Tokenizer *t, Builder *b, const ChatMessage *msgs, int n, int gen) {
    for (int i = 0; i < n; i++) {
        int asst = role_is(&msgs[i], "assistant");
        if (i == 0 && t->bos_id >= 0) puts0(b, t->pieces[t->bos_id]);
        puts0(b, "<|start_header_id|>");
        puts0(b, msgs[i].role);
        puts0(b, "<|end_header_id|>\n\n");
        const char *c = msgs[i].content;
        size_t cn = strlen(c);
        strip_span(&c, &cn, 1, 1, NULL);
        put(b, c, cn, asst);
        put(b, "<|eot_id|>", 10, asst);
    }
    if (gen) puts0(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    return 0;
}

char *chat_render_text(const Tokenizer *t, ChatFormat f, const ChatMessage *msgs, int n_msgs,
                       int add_generation_prompt, unsigned char **byte_mask, size_t *len,
                       char *err, size_t errlen) {
    Builder b = {0};
    int rc = 0;
    /* Invalid UTF-8 in a message becomes U+FFFD here, so byte offsets match what is encoded. */
    ChatMessage *clean = xcalloc((size_t)n_msgs + 1, sizeof(ChatMessage));
    char **owned = xcalloc((size_t)n_msgs + 1, sizeof(char *));
    for (int i = 0; i < n_msgs; i++) {
        size_t cl;
        clean[i] = msgs[i];
        if (!clean[i].content) clean[i].content = "";
        if ((owned[i] = utf8_sanitize(clean[i].content, strlen(clean[i].content), &cl))) clean[i].content = owned[i];
    }
    put(&b, "", 0, 0);
    switch (f) {
    case CHAT_LLAMA2: rc = render_llama2(t, &b, clean, n_msgs, err, errlen); break;
    case CHAT_MISTRAL: rc = render_mistral(t, &b, clean, n_msgs, err, errlen); break;
    case CHAT_CHATML: rc = render_chatml(t, &b, clean, n_msgs, add_generation_prompt); break;
    case CHAT_CHATML_THINK: rc = render_chatml_think(&b, clean, n_msgs, add_generation_prompt, err, errlen); break;
    case CHAT_LLAMA3: rc = render_llama3(t, &b, clean, n_msgs, add_generation_prompt); break;
    case CHAT_QWEN3:
    case CHAT_QWEN3_NOTHINK:
        rc = render_qwen3(&b, clean, n_msgs, add_generation_prompt, f == CHAT_QWEN3_NOTHINK, err, errlen);
        break;
    default: rc = fail(err, errlen, "chat format %d out of range", (int)f);
    }
    for (int i = 0; i < n_msgs; i++) free(owned[i]);
    free(owned);
    free(clean);
    if (rc) {
        free(b.s);
        free(b.m);
        return NULL;
    }
    *byte_mask = b.m;
    *len = b.n;
    return b.s;
}

int chat_render(Tokenizer *t, ChatFormat f, const ChatMessage *msgs, int n_msgs,
                int add_generation_prompt, TokIds *ids, TokIds *mask, char *err, size_t errlen) {
    unsigned char *bm;
    size_t len;
    char *text = chat_render_text(t, f, msgs, n_msgs, add_generation_prompt, &bm, &len, err, errlen);
    if (!text) return -1;
    TokIds starts = {0};
    size_t first = ids->n;
    tokenizer_encode(t, text, len, 0, ids, &starts);
    for (size_t i = 0; i < ids->n - first; i++) {
        size_t s = (size_t)starts.ids[i];
        tok_ids_push(mask, s < len ? bm[s] : 0);
    }
    tok_ids_free(&starts);
    free(text);
    free(bm);
    return 0;
}

/* ---------------------------------------------------------------- messages from JSON */

/* One field of a message as a string: 0, or -1 with err. null_ok: a null value is "". */
static int message_field(const cJSON *e, const char *arr_key, int i, const char *key, int null_ok, const char **out,
                         char *err, size_t errlen) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(e, key);
    *out = "";
    if (!v) return fail(err, errlen, "%s[%d]: field \"%s\" missing", arr_key, i, key);
    if (cJSON_IsNull(v) && null_ok) return 0;
    if (!cJSON_IsString(v)) return fail(err, errlen, "%s[%d]: field \"%s\" is not a string", arr_key, i, key);
    *out = v->valuestring;
    return 0;
}

int chat_messages_parse(const cJSON *arr, const char *arr_key, const char *role_key, const char *content_key,
                        ChatMessage *m, char *err, size_t errlen) {
    if (!cJSON_IsArray(arr)) return fail(err, errlen, "field \"%s\" is not an array", arr_key);
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) {
        if (!cJSON_IsObject(e)) return fail(err, errlen, "%s[%d] is not an object", arr_key, i);
        if (message_field(e, arr_key, i, role_key, 0, &m[i].role, err, errlen) ||
            message_field(e, arr_key, i, content_key, 1, &m[i].content, err, errlen))
            return -1;
        i++;
    }
    return i;
}
