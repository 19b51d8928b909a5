// The lock-order checker's switch (see cshims_tsan.h).
#include <stdlib.h>
#include <string.h>

#include "cshims_tsan.h"

int cshims_lock_order_flag = 0;
__thread void *cshims_lock_order_record = NULL;

// Read once, before main and before any Spindle lock can be taken.
__attribute__((constructor)) static void cshims_lock_order_read_environment(void) {
    const char *value = getenv("SPINDLE_LOCK_ORDER");
    if (value != NULL && strcmp(value, "1") == 0) cshims_lock_order_flag = 1;
}
