/* convert.h — `tandem convert --from llama2c MODEL.bin [--tokenizer tokenizer.model] --out DIR` */
#ifndef TANDEM_CONVERT_H
#define TANDEM_CONVERT_H
int convert_main(int argc, char **argv);
#endif
