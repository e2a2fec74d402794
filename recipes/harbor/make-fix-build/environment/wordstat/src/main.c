#include <stdio.h>

#include "stats.h"

int main(void) {
    struct stats st;
    stats_read(stdin, &st);
    printf("words %zu\nlongest %s\n", st.words, st.longest);
    return 0;
}
