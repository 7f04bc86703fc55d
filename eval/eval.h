/* eval.h — `tandem eval`: Hugging Face parity (--reference) and loss / perplexity (--data). */
#ifndef TANDEM_EVAL_H
#define TANDEM_EVAL_H
int eval_main(int argc, char **argv);
#endif
