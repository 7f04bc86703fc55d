/* generate.h — `tandem generate`: offline batch generation from jsonl. What a line asks for is
 * generate/request.h (shared with `tandem ppo`); the output file is generate/output.h. */
#ifndef TANDEM_GENERATE_H
#define TANDEM_GENERATE_H

int generate_main(int argc, char **argv);
#endif
