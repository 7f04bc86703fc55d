/* generate.h — `tandem generate`: offline batch generation from jsonl. */
#ifndef TANDEM_GENERATE_H
#define TANDEM_GENERATE_H
int generate_main(int argc, char **argv);
#endif
