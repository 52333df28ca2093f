#include "mixed_jsonl.h"

#include <stdio.h>

int test_write_mixed_jsonl(const char *path, int n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    for (int i = 0; i < n; i++) {
        switch (i % 7) {
        case 0:
            fprintf(f, "{\"text\": \"document number %d is fine\", \"y\": %d}\n", i, i % 2);
            break;
        case 1:
            fprintf(f, "{\"text\": \"broken %d\"\n", i);
            break;
        case 2:
            fprintf(f, "{\"y\": 1}\n");
            break;
        case 3:
            fprintf(f, "{\"text\": \"bad label\", \"y\": \"x%d\"}\n", i);
            break;
        case 4:
            fprintf(f, "\n");
            break; /* blank: not a record */
        case 5:
            fprintf(f, "{\"text\": \"   \", \"y\": 0}\n");
            break;
        default:
            fprintf(f, "{\"text\": \"caf\xc3\xa9 %d \xff\", \"y\": 1}\n", i);
            break;
        }
    }
    return fclose(f) ? -1 : 0;
}
