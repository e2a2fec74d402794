#include <ctype.h>
#include <string.h>

#include "stats.h"

/* Counts whitespace-separated words; keeps the first longest one (up to 255 bytes of it). */
void stats_read(FILE *in, struct stats *st) {
    char cur[256];
    size_t len = 0, best = 0;
    int c;
    st->words = 0;
    st->longest[0] = '\0';
    do {
        c = fgetc(in);
        if (c == EOF || isspace(c)) {
            if (len > 0) {
                st->words++;
                if (len > best) {
                    best = len;
                    memcpy(st->longest, cur, len < 255 ? len : 255);
                    st->longest[len < 255 ? len : 255] = '\0';
                }
            }
            len = 0;
        } else {
            if (len < 255)
                cur[len] = (char)c;
            len++;
        }
    } while (c != EOF);
}
