/* tandem.c — the one binary. Only dispatches subcommands; every job lives in its module. */
#include <stdio.h>
#include <signal.h>
#include <string.h>
#include "bench/bench.h"
#include "eval/eval.h"
#include "generate/generate.h"
#include "runtime/convert.h"
#include "runtime/fetch.h"
#include "tokenizer/tokenize_cli.h"
#include "rlhf/pref.h"
#include "rlhf/ppo.h"
#include "rlhf/verify.h"
#include "train/sft.h"

typedef struct {
    const char *name;
    int (*main)(int argc, char **argv);
    const char *help;
} Command;

static const Command commands[] = {
    {"generate", generate_main, "offline batch generation from jsonl (sampling, KV cache, continuous batching)"},
    {"eval", eval_main, "Hugging Face parity (--reference) or loss/perplexity (--data) of a model"},
    {"sft", sft_main, "supervised fine-tuning (TP x PP x DP, 1F1B, AdamW, ZeRO-1/2/3, LoRA, checkpoints, resume)"},
    {"rm", rm_main, "reward-model training on preference pairs (score head, Bradley-Terry)"},
    {"dpo", dpo_main, "direct preference optimization against a frozen reference (sigmoid, IPO)"},
    {"ppo", ppo_main, "PPO / GRPO / RLOO: actor, critic, reference and reward as role groups; rollouts from the training shards"},
    {"fetch", fetch_main, "download a model from the Hugging Face Hub into its cache (resume, retries, hash checks)"},
    {"convert", convert_main, "a Hugging Face directory from a llama2.c checkpoint, or random weights of a shape (for benchmarks)"},
    {"bench", bench_main, "throughput and memory: prefill, decode (--generate), training steps (--train), kernels, tokenizers"},
    {"tokenize", tokenize_main, "text <-> token ids with a model's tokenizer"},
    {"verify", verify_main, "verifiable rewards of responses: math answers, code run on tests in a sandbox, answer format"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: tandem <command> [options]   (tandem <command> --help for its options)\n\n");
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\nSeveral ranks: mpirun -np N tandem <command> --tp T --pp P ...\n");
}

int main(int argc, char **argv) {
    /* A file-size limit (ulimit -f) makes a write fail with EFBIG, which every writer reports like a
     * full disk (one line, exit 1, nothing half-written), instead of SIGXFSZ killing the process
     * mid-line without a word. Set before MPI starts, and for the whole process. */
    signal(SIGXFSZ, SIG_IGN);
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].main(argc - 1, argv + 1);
    fprintf(stderr, "tandem: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
