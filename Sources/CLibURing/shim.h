#include <liburing.h>
