/* cli/inspect.c: `spillway inspect MODEL`. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

int cli_inspect(int argc, char **argv)
{
    if (argc != 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fprintf(argc == 2 ? stdout : stderr, "usage: spillway inspect MODEL.gguf\n");
        return argc == 2 ? 0 : 2;
    }
    char err[512];
    if (engine_inspect(argv[1], stdout, err, sizeof err) != 0) {
        fprintf(stderr, "spillway: %s\n", err);
        return 1;
    }
    return 0;
}
