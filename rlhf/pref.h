/* pref.h — `tandem rm` and `tandem dpo` (rlhf/pref.c). */
#ifndef TANDEM_PREF_H
#define TANDEM_PREF_H
int rm_main(int argc, char **argv);
int dpo_main(int argc, char **argv);
#endif
