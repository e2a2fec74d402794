#ifndef WORDSTAT_STATS_H
#define WORDSTAT_STATS_H

#include <stddef.h>
#include <stdio.h>

struct stats {
    size_t words;
    char longest[256];
};

void stats_read(FILE *in, struct stats *st);

#endif
