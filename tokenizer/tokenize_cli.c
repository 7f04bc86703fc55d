/* tokenize_cli.c — `tandem tokenize` (placeholder until the tokenizer issue lands). */
#include "tokenizer/tokenize_cli.h"
#include <stdio.h>
int tokenize_main(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "tandem: tokenize is not implemented yet\n");
    return 1;
}
