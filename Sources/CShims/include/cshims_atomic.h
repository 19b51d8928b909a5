// Atomic operations on arbitrary addresses, memory barriers and the spin-wait
// hint. Policy-free: Spindle's Swift layer decides what to call and why.
//
// Every atomic goes through the compiler's __atomic builtins so that
// ThreadSanitizer sees it. The barrier functions are inline assembly, which
// ThreadSanitizer does NOT see: no lock may rely on them for its ordering.
//
// The memory order is an argument (one of the CSHIMS_ORDER_* values). Called
// with a constant, as Spindle always does, the switch the compiler emits for
// it folds away once the function is inlined.
#ifndef CSHIMS_ATOMIC_H
#define CSHIMS_ATOMIC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if !defined(__x86_64__) && !defined(__aarch64__)
#error "Spindle's CShims support x86_64 and AArch64 only: add this architecture's barriers and spin hint first."
#endif

#define CSHIMS_INLINE static inline __attribute__((always_inline))

// The C11 memory orders, under names Swift can import.
typedef enum {
    CSHIMS_ORDER_RELAXED = __ATOMIC_RELAXED,
    CSHIMS_ORDER_ACQUIRE = __ATOMIC_ACQUIRE,
    CSHIMS_ORDER_RELEASE = __ATOMIC_RELEASE,
    CSHIMS_ORDER_ACQ_REL = __ATOMIC_ACQ_REL,
    CSHIMS_ORDER_SEQ_CST = __ATOMIC_SEQ_CST,
} cshims_order;

// A compare-and-swap's failure order may not contain a release and may not be
// stronger than its success order.
CSHIMS_INLINE int cshims_order_for_failure(int order) {
    switch (order) {
    case __ATOMIC_RELEASE: return __ATOMIC_RELAXED;
    case __ATOMIC_ACQ_REL: return __ATOMIC_ACQUIRE;
    default: return order;
    }
}

// --- Words: 32-bit, 64-bit and pointer-sized -------------------------------
// For each width: load, store, exchange, compare-and-swap (strong; on failure
// *expected receives the value found), fetch-add/and/or/xor (return the value
// before the operation).
#define CSHIMS_DEFINE_WORD_OPS(SUFFIX, T)                                              \
    CSHIMS_INLINE T cshims_atomic_load_##SUFFIX(const T *p, int order) {               \
        return __atomic_load_n(p, order);                                              \
    }                                                                                  \
    CSHIMS_INLINE void cshims_atomic_store_##SUFFIX(T *p, T v, int order) {            \
        __atomic_store_n(p, v, order);                                                 \
    }                                                                                  \
    CSHIMS_INLINE T cshims_atomic_exchange_##SUFFIX(T *p, T v, int order) {            \
        return __atomic_exchange_n(p, v, order);                                       \
    }                                                                                  \
    CSHIMS_INLINE bool cshims_atomic_cas_##SUFFIX(T *p, T *expected, T desired,        \
                                                  int order) {                         \
        return __atomic_compare_exchange_n(p, expected, desired, false, order,         \
                                           cshims_order_for_failure(order));           \
    }                                                                                  \
    CSHIMS_INLINE bool cshims_atomic_cas_weak_##SUFFIX(T *p, T *expected, T desired,   \
                                                       int order) {                    \
        return __atomic_compare_exchange_n(p, expected, desired, true, order,          \
                                           cshims_order_for_failure(order));           \
    }                                                                                  \
    CSHIMS_INLINE T cshims_atomic_fetch_add_##SUFFIX(T *p, T v, int order) {           \
        return __atomic_fetch_add(p, v, order);                                        \
    }                                                                                  \
    CSHIMS_INLINE T cshims_atomic_fetch_and_##SUFFIX(T *p, T v, int order) {           \
        return __atomic_fetch_and(p, v, order);                                        \
    }                                                                                  \
    CSHIMS_INLINE T cshims_atomic_fetch_or_##SUFFIX(T *p, T v, int order) {            \
        return __atomic_fetch_or(p, v, order);                                         \
    }                                                                                  \
    CSHIMS_INLINE T cshims_atomic_fetch_xor_##SUFFIX(T *p, T v, int order) {           \
        return __atomic_fetch_xor(p, v, order);                                        \
    }

CSHIMS_DEFINE_WORD_OPS(u32, uint32_t)
CSHIMS_DEFINE_WORD_OPS(u64, uint64_t)
CSHIMS_DEFINE_WORD_OPS(uptr, uintptr_t)
#undef CSHIMS_DEFINE_WORD_OPS

// --- Test-and-set / test-and-clear, in the guide's bit order ----------------
// Bit n is the bit (0x80 >> (n & 7)) of the byte at base + (n >> 3): each byte
// is numbered from its most significant bit, so bit 0 of a little-endian
// int32_t set to 1 is bit number 7. Returns the bit's previous value.
CSHIMS_INLINE bool cshims_atomic_test_and_set_bit(void *base, uint64_t n, int order) {
    uint8_t *byte = (uint8_t *)base + (n >> 3);
    uint8_t mask = (uint8_t)(0x80u >> (n & 7));
    return (__atomic_fetch_or(byte, mask, order) & mask) != 0;
}

CSHIMS_INLINE bool cshims_atomic_test_and_clear_bit(void *base, uint64_t n, int order) {
    uint8_t *byte = (uint8_t *)base + (n >> 3);
    uint8_t mask = (uint8_t)(0x80u >> (n & 7));
    return (__atomic_fetch_and(byte, (uint8_t)~mask, order) & mask) != 0;
}

// Reads bit n (same numbering) with a one-byte atomic load.
CSHIMS_INLINE bool cshims_atomic_test_bit(const void *base, uint64_t n, int order) {
    const uint8_t *byte = (const uint8_t *)base + (n >> 3);
    return (__atomic_load_n(byte, order) & (0x80u >> (n & 7))) != 0;
}

// A fence of the given C11 order (__atomic_thread_fence): acquire and release
// fences cost nothing on x86_64 beyond stopping the compiler; on AArch64 they
// are dmb ishld / dmb ish.
CSHIMS_INLINE void cshims_fence(int order) { __atomic_thread_fence(order); }

// --- Hardware barriers (inline assembly; invisible to ThreadSanitizer) ------
// full:  no load or store after it is performed before every load and store
//        before it has completed (x86 mfence; AArch64 dmb ish).
// load:  loads before it complete before loads after it (lfence; dmb ishld,
//        which also orders earlier loads before later stores).
// store: stores before it become visible before stores after it (sfence;
//        dmb ishst). On x86 lfence/sfence only matter for non-temporal and
//        write-combining memory; ordinary x86 loads and stores are already
//        ordered that way.
// compiler: stops the compiler from moving memory accesses across it; emits
//        no instruction.
CSHIMS_INLINE void cshims_barrier_compiler(void) { __asm__ __volatile__("" ::: "memory"); }

#if defined(__x86_64__)
CSHIMS_INLINE void cshims_barrier_full(void) { __asm__ __volatile__("mfence" ::: "memory"); }
CSHIMS_INLINE void cshims_barrier_load(void) { __asm__ __volatile__("lfence" ::: "memory"); }
CSHIMS_INLINE void cshims_barrier_store(void) { __asm__ __volatile__("sfence" ::: "memory"); }
// pause: tells the core this is a spin-wait loop (saves power, frees the
// sibling hyper-thread, avoids the memory-order mis-speculation flush when the
// awaited store arrives).
CSHIMS_INLINE void cshims_spin_hint(void) { __asm__ __volatile__("pause" ::: "memory"); }
#elif defined(__aarch64__)
CSHIMS_INLINE void cshims_barrier_full(void) { __asm__ __volatile__("dmb ish" ::: "memory"); }
CSHIMS_INLINE void cshims_barrier_load(void) { __asm__ __volatile__("dmb ishld" ::: "memory"); }
CSHIMS_INLINE void cshims_barrier_store(void) { __asm__ __volatile__("dmb ishst" ::: "memory"); }
// isb rather than yield: on the Neoverse and Cortex-A7x cores that run Linux
// servers, yield retires as a no-op in about one cycle, so a spin loop built
// on it hammers the cache line; isb flushes the pipeline and stalls for tens
// of cycles, which is the back-off a spin wait wants (the reasoning behind
// Rust's core::hint::spin_loop, HotSpot's OnSpinWait on AArch64 and MySQL's
// ut_delay). See spinLoopHint()'s documentation for the measurement caveat.
CSHIMS_INLINE void cshims_spin_hint(void) { __asm__ __volatile__("isb" ::: "memory"); }
#endif

#endif // CSHIMS_ATOMIC_H
