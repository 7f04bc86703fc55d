/* args.c — see args.h. */
#include "runtime/args.h"
#include "runtime/comm.h"
#include "runtime/hub.h"
#include "runtime/util.h"
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_GIVEN = 256 };
static const void *g_given[MAX_GIVEN];   /* the ptr of each option the last args_parse read from argv, once */
static int g_n_given;

int args_given(const void *ptr) {
    for (int i = 0; i < g_n_given; i++)
        if (g_given[i] == ptr) return 1;
    return 0;
}

static void set_value(const Option *o, const char *v) {
    char *end = NULL;
    errno = 0;
    switch (o->type) {
    case OPT_INT: {
        long x = strtol(v, &end, 10);
        if (errno || end == v || *end || x < -2147483647L || x > 2147483647L)
            user_error("%s: expected an integer, got \"%s\"", o->name, v);
        *(int *)o->ptr = (int)x;
        break;
    }
    case OPT_FLOAT: {
        float x = strtof(v, &end);
        if (errno || end == v || *end || !isfinite(x)) user_error("%s: expected a number, got \"%s\"", o->name, v);
        *(float *)o->ptr = x;
        break;
    }
    case OPT_STR:
    case OPT_MODEL: *(const char **)o->ptr = v; break;
    case OPT_FLAG: *(int *)o->ptr = 1; break;
    }
}

static void usage(const char *text, const Option *opts, int n) {
    printf("%s\n\noptions:\n", text);
    for (int i = 0; i < n; i++) {
        const char *arg = opts[i].type == OPT_INT ? " N" : opts[i].type == OPT_FLOAT ? " X" : opts[i].type == OPT_STR ? " S" : opts[i].type == OPT_MODEL ? " DIR|ORG/NAME" : "";
        char left[64];
        snprintf(left, sizeof(left), "%s%s", opts[i].name, arg);
        printf("  %-26s %s", left, opts[i].help);
        if (opts[i].dflt && opts[i].type != OPT_FLAG) printf(" (default %s)", opts[i].dflt);
        printf("\n");
    }
}

void args_parse(const char *usage_text, Option *opts, int n, int argc, char **argv) {
    g_n_given = 0;
    for (int i = 0; i < n; i++) {
        if (opts[i].type == OPT_FLAG) *(int *)opts[i].ptr = 0;
        else if (opts[i].type == OPT_STR || opts[i].type == OPT_MODEL) *(const char **)opts[i].ptr = opts[i].dflt;
        else if (opts[i].dflt) set_value(&opts[i], opts[i].dflt);
        else if (opts[i].type == OPT_INT) *(int *)opts[i].ptr = 0;
        else *(float *)opts[i].ptr = 0.0f;
    }
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "--help") || !strcmp(argv[a], "-h")) {
            if (util_is_reporter()) usage(usage_text, opts, n);   /* the group's root; before any group, world rank 0 */
            comm_finalize();
            exit(0);
        }
        const Option *o = NULL;
        for (int i = 0; i < n && !o; i++)
            if (!strcmp(argv[a], opts[i].name)) o = &opts[i];
        if (!o) user_error("unknown option '%s' (see --help)", argv[a]);
        if (!args_given(o->ptr) && g_n_given < MAX_GIVEN) g_given[g_n_given++] = o->ptr;
        if (o->type == OPT_FLAG) { set_value(o, NULL); continue; }
        if (a + 1 >= argc) user_error("%s needs a value", o->name);
        set_value(o, argv[++a]);
    }
    for (int i = 0; i < n; i++)   /* after every flag is known good: a Hub id may mean a download */
        if (opts[i].type == OPT_MODEL) *(const char **)opts[i].ptr = hub_model_path(*(const char **)opts[i].ptr);
}

void args_print(const Option *opts, int n) {
    for (int i = 0; i < n; i++) {
        const Option *o = &opts[i];
        switch (o->type) {
        case OPT_INT: fprintf(stderr, "| %-22s | %-30d |\n", o->name, *(int *)o->ptr); break;
        case OPT_FLOAT: fprintf(stderr, "| %-22s | %-30g |\n", o->name, *(float *)o->ptr); break;
        case OPT_STR:
        case OPT_MODEL: fprintf(stderr, "| %-22s | %-30s |\n", o->name, *(const char **)o->ptr ? *(const char **)o->ptr : "-"); break;
        case OPT_FLAG: fprintf(stderr, "| %-22s | %-30s |\n", o->name, *(int *)o->ptr ? "on" : "off"); break;
        }
    }
}
