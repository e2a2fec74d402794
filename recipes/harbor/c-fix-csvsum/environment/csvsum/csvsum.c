/* csvsum: sums the amounts of "name,amount" lines per name. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct entry {
    char name[16];
    int cents;
};

static struct entry table[64];
static int used;

static int cmp(const void *a, const void *b) {
    return strcmp(((const struct entry *)a)->name, ((const struct entry *)b)->name);
}

static void add(const char *name, int cents) {
    for (int i = 0; i < used; i++)
        if (strcmp(table[i].name, name) == 0) {
            table[i].cents += cents;
            return;
        }
    strcpy(table[used].name, name);
    table[used++].cents = cents;
}

int main(void) {
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        if (line[strlen(line) - 1] != '\n')
            break;
        char *comma = strchr(line, ',');
        if (!comma)
            continue;
        *comma = '\0';
        add(line, (int)(atof(comma + 1) * 100));
    }
    qsort(table, used, sizeof table[0], cmp);
    for (int i = 0; i < used; i++)
        printf("%s %d.%02d\n", table[i].name, table[i].cents / 100, table[i].cents % 100);
    return 0;
}
