#!/bin/bash
set -euo pipefail
cat > /app/csvsum/csvsum.c <<'C'
/* csvsum: sums the amounts of "name,amount" lines per name, in exact cents. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct entry {
    char name[101];
    long long cents;
};

static struct entry table[500];
static int used;

static int cmp(const void *a, const void *b) {
    return strcmp(((const struct entry *)a)->name, ((const struct entry *)b)->name);
}

static void add(const char *name, long long cents) {
    for (int i = 0; i < used; i++)
        if (strcmp(table[i].name, name) == 0) {
            table[i].cents += cents;
            return;
        }
    snprintf(table[used].name, sizeof table[used].name, "%s", name);
    table[used++].cents = cents;
}

/* "-12.5" -> -1250: the integer part, then up to two decimals, without floating point. */
static long long parse_cents(const char *s) {
    int neg = *s == '-';
    if (neg)
        s++;
    long long v = 0;
    while (*s >= '0' && *s <= '9')
        v = v * 10 + (*s++ - '0');
    v *= 100;
    if (*s == '.') {
        s++;
        if (*s >= '0' && *s <= '9') {
            v += 10 * (*s++ - '0');
            if (*s >= '0' && *s <= '9')
                v += *s - '0';
        }
    }
    return neg ? -v : v;
}

int main(void) {
    char line[256];
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\r\n")] = '\0';
        char *comma = strchr(line, ',');
        if (!comma)
            continue;
        *comma = '\0';
        add(line, parse_cents(comma + 1));
    }
    qsort(table, used, sizeof table[0], cmp);
    for (int i = 0; i < used; i++) {
        long long c = table[i].cents, a = c < 0 ? -c : c;
        printf("%s %s%lld.%02lld\n", table[i].name, c < 0 ? "-" : "", a / 100, a % 100);
    }
    return 0;
}
C
cd /app/csvsum && gcc -O1 -o csvsum csvsum.c
