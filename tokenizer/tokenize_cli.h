/* tokenize_cli.h — `tandem tokenize` entry point. */
#ifndef TANDEM_TOKENIZE_CLI_H
#define TANDEM_TOKENIZE_CLI_H
int tokenize_main(int argc, char **argv);
#endif
