// Spindle's boundary with the kernel: one place that makes system calls and
// issues atomic and barrier instructions. See each header for its contract.
#ifndef CSHIMS_H
#define CSHIMS_H

#include "cshims_atomic.h"
#include "cshims_futex.h"
#include "cshims_system.h"
#include "cshims_uring.h"
#include "cshims_event.h"
#include "cshims_file.h"
#include "cshims_sources.h"
#include "cshims_ports.h"
#include "cshims_tsan.h"

#endif // CSHIMS_H
