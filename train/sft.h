/* sft.h — `tandem sft`: supervised fine-tuning on the TP x PP x DP mesh. */
#ifndef TANDEM_SFT_H
#define TANDEM_SFT_H
int sft_main(int argc, char **argv);
#endif
