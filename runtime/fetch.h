/* fetch.h — the `tandem fetch` command: parses its flags and hands the download to runtime/hub.c.
 * Owns: the command line of `tandem fetch` and its one line of output (the snapshot directory).
 * Does not own the Hub protocol, the cache layout or the downloads (runtime/hub.h). */
#ifndef TANDEM_FETCH_H
#define TANDEM_FETCH_H

int fetch_main(int argc, char **argv);
#endif
