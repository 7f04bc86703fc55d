/* hub.h — models from the Hugging Face Hub: the library under `tandem fetch` and `--model ORG/NAME`.
 *
 * Downloads a model repository the way huggingface_hub does: the file list (with blob ids, sizes and
 * LFS sha256) from {endpoint}/api/models/{repo}/revision/{rev}?blobs=true, then each file from
 * {endpoint}/{repo}/resolve/{commit}/{file} into the hub cache that huggingface_hub uses
 * (HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub):
 *     models--ORG--NAME/blobs/{sha256 for LFS files, git blob id otherwise}
 *     models--ORG--NAME/snapshots/{commit}/{file} -> ../../blobs/{...}   (relative symlinks)
 *     models--ORG--NAME/refs/{revision}            the commit, no newline
 *     .locks/models--ORG--NAME/{blob}.lock         flock'd while a blob downloads (as filelock does)
 * so a model fetched by either tool is found by the other. Partial downloads live in
 * blobs/{blob}.incomplete and resume with HTTP Range; 429, 5xx, dropped and stalled connections are
 * retried with backoff; every file is checked against the API's size and hash (LFS sha256, else the
 * git blob sha1) before it is renamed into place. HF_ENDPOINT, HF_TOKEN (else the token file under
 * HF_HOME) and HF_HUB_OFFLINE are honoured.
 * Owns: the Hub protocol, the cache layout, what is downloaded where and how it is checked. Does not
 * own the `tandem fetch` command line (runtime/fetch.c), HTTP (runtime/http.c: the GET with retries
 * and Range resumes, the retry policy, the progress bar, the failure line that hub.c's advice ends)
 * or MPI (runtime/comm.c: one rank per node fetches through it). Knows nothing of models beyond
 * "config.json and safetensors make a usable snapshot". */
#ifndef TANDEM_HUB_H
#define TANDEM_HUB_H
#include <stdint.h>

/* Fetches repo ("ORG/NAME", passing hub_repo_id_error) at rev (branch, tag or commit, passing
 * hub_revision_error) into the hub cache, or into dir when it is not NULL: the files matching one of
 * the n_include globs, else (n_include 0) the top level's config,
 * tokenizer and safetensors files. timeout: s a connection may take to open or stall; retries:
 * attempts after a failure that moved no bytes. Progress on stderr (a bar on a terminal, else a line
 * per file). Returns the snapshot directory (or dir), malloc'd; errors stop the job with one line. */
char *hub_fetch(const char *repo, const char *rev, const char *dir, char **include, int n_include, int timeout,
                int retries);

/* A --model value: an existing directory (or anything that is not a Hub repo id "ORG/NAME" whose ORG
 * is not a local directory) comes back as is; a repo id comes back as its snapshot directory in the
 * cache, fetched first when missing (said on stderr). Under mpirun one rank per node fetches while
 * the node's others wait. Errors stop the job with one line naming the URL and status. */
const char *hub_model_path(const char *arg);

/* One file of a revision, as the Hub API lists it. */
typedef struct {
    char *name;            /* path in the repository (hub_safe_rel_path holds) */
    char *blob;            /* the cache's blob name: LFS sha256 (64 hex), else the git blob id (40 hex) */
    int64_t size;
    int lfs;
} HubFile;

/* The parse step of the file list: answer (the API's NUL-terminated body, NULL for none; an error
 * message quotes it, made one line in place) for repo at rev, named `url` in errors. Returns the
 * commit (malloc'd) and the wanted files (as hub_fetch's include globs choose them) into *files
 * (*n_files, at least one; hub_files_free). A malformed answer, an unsafe file name, a wanted file
 * without its hash and size, or nothing to fetch is a user_error. */
char *hub_parse_files(char *answer, const char *url, const char *repo, const char *rev, char **include,
                      int n_include, HubFile **files, int *n_files);
void hub_files_free(HubFile *files, int n);

/* 1 when f is a plain relative path: no leading '/', no part that is empty, "." or "..", no '\\' and
 * no control bytes. What a file name from the server must be. */
int hub_safe_rel_path(const char *f);

/* NULL when id is a model id "ORG/NAME" by the Hub's rules (huggingface_hub's validate_repo_id, the ORG
 * required, ASCII only): ORG and NAME of letters, digits, '-', '_' and '.', each starting and ending
 * with a letter, digit or '_'; no "--" or ".."; NAME at most 96 characters, not ending in ".git".
 * Else what is wrong, for a message ("'?' is not allowed (...)"). */
const char *hub_repo_id_error(const char *id);

/* NULL when rev can be a branch, a tag or a commit: git's ref-name rules (no control bytes, space,
 * '~', '^', ':', '?', '*', '[', '\\'; no "..", "//", "@{"; no part starting with '.' or ending in
 * ".lock"; not ending in '/' or '.'), printable ASCII without '#' and '%', at most 255 bytes. Else what
 * is wrong, for a message. */
const char *hub_revision_error(const char *rev);
#endif
