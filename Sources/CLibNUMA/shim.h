#include <numa.h>
