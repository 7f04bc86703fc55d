/* ppo.h — `tandem ppo`: PPO / GRPO / RLOO with role groups (rlhf/ppo.c). */
#ifndef TANDEM_PPO_H
#define TANDEM_PPO_H
int ppo_main(int argc, char **argv);
#endif
