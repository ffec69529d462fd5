/* tests/fuzz/replay_main.c: driver that replays fuzz inputs without libFuzzer.
 * Usage: fuzz_X PATH...  Each PATH is a file or a directory (its regular files, sorted by name,
 * not recursing; names starting with '.' skipped). Every input is read into an exact-size heap
 * buffer (so ASan sees over-reads) and passed to LLVMFuzzerTestOneInput. Prints how many inputs
 * ran; exits 0, or 1 when a PATH cannot be read. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    uint8_t *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len == cap) {
            cap = cap ? cap * 2 : 4096;
            uint8_t *p = realloc(buf, cap);
            if (!p) {
                free(buf);
                fclose(f);
                return -1;
            }
            buf = p;
        }
        size_t n = fread(buf + len, 1, cap - len, f);
        len += n;
        if (n == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return -1;
    }
    uint8_t *exact = malloc(len ? len : 1);
    if (!exact) {
        free(buf);
        return -1;
    }
    if (len) memcpy(exact, buf, len);
    free(buf);
    LLVMFuzzerTestOneInput(exact, len);
    free(exact);
    return 0;
}

static int skip_dot(const struct dirent *e)
{
    return e->d_name[0] != '.';
}

int main(int argc, char **argv)
{
    long ran = 0;
    int rc = 0;
    for (int a = 1; a < argc; a++) {
        struct stat st;
        if (stat(argv[a], &st) != 0) {
            fprintf(stderr, "replay: cannot read %s\n", argv[a]);
            rc = 1;
            continue;
        }
        if (!S_ISDIR(st.st_mode)) {
            if (run_file(argv[a]) == 0) ran++;
            else { fprintf(stderr, "replay: cannot read %s\n", argv[a]); rc = 1; }
            continue;
        }
        struct dirent **ents;
        int n = scandir(argv[a], &ents, skip_dot, alphasort);
        if (n < 0) {
            fprintf(stderr, "replay: cannot list %s\n", argv[a]);
            rc = 1;
            continue;
        }
        for (int i = 0; i < n; i++) {
            size_t pl = strlen(argv[a]) + strlen(ents[i]->d_name) + 2;
            char *p = malloc(pl);
            if (p) {
                snprintf(p, pl, "%s/%s", argv[a], ents[i]->d_name);
                if (stat(p, &st) == 0 && S_ISREG(st.st_mode)) {
                    if (run_file(p) == 0) ran++;
                    else { fprintf(stderr, "replay: cannot read %s\n", p); rc = 1; }
                }
                free(p);
            }
            free(ents[i]);
        }
        free(ents);
    }
    printf("replayed %ld inputs\n", ran);
    return rc;
}
