// The C shims' atomics, test-and-set/clear, barriers, spin hint and futex
// calls, checked on whatever architecture this is compiled for.
// scripts/cross-aarch64 builds it for AArch64 and runs it under qemu-user;
// the same assertions hold on x86_64 (scripts/cross-aarch64 --native).
// Exit 0 and "N passed, 0 failed" when every check holds.
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "cshims_atomic.h"
#include "cshims_futex.h"

static int passed, failed;

#define CHECK(cond)                                                            \
    do {                                                                       \
        if (cond) passed++;                                                    \
        else { failed++; fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); } \
    } while (0)

static void listing_4_1(void) {
    // The guide's Listing 4-1 with its exact values.
    int32_t value = 0;
    cshims_atomic_test_and_set_bit(&value, 0, CSHIMS_ORDER_SEQ_CST);
    CHECK(value == 128);
    value = 0;
    cshims_atomic_test_and_set_bit(&value, 7, CSHIMS_ORDER_SEQ_CST);
    CHECK(value == 1);
    value = 0;
    cshims_atomic_test_and_set_bit(&value, 15, CSHIMS_ORDER_SEQ_CST);
    CHECK(value == 256);
    uint32_t expected = 256;
    CHECK(cshims_atomic_cas_u32((uint32_t *)&value, &expected, 512, CSHIMS_ORDER_SEQ_CST));
    CHECK(value == 512);
    expected = 256;
    CHECK(!cshims_atomic_cas_u32((uint32_t *)&value, &expected, 1024, CSHIMS_ORDER_SEQ_CST));
    CHECK(value == 512);
    CHECK(expected == 512); // a failed CAS reports what it found
}

static void bit_order(void) {
    uint32_t w = 0;
    CHECK(!cshims_atomic_test_and_set_bit(&w, 7, CSHIMS_ORDER_RELAXED));
    CHECK(w == 1);
    CHECK(!cshims_atomic_test_and_set_bit(&w, 24, CSHIMS_ORDER_SEQ_CST));
    CHECK(w == 0x80000001u);
    CHECK(cshims_atomic_test_and_set_bit(&w, 24, CSHIMS_ORDER_SEQ_CST));
    CHECK(cshims_atomic_test_and_clear_bit(&w, 24, CSHIMS_ORDER_SEQ_CST));
    CHECK(!cshims_atomic_test_and_clear_bit(&w, 24, CSHIMS_ORDER_RELAXED));
    CHECK(cshims_atomic_test_bit(&w, 7, CSHIMS_ORDER_ACQUIRE));
    CHECK(!cshims_atomic_test_bit(&w, 6, CSHIMS_ORDER_ACQUIRE));

    unsigned char field[37];
    memset(field, 0, sizeof field);
    for (uint64_t bit = 0; bit < sizeof field * 8; bit++) {
        CHECK(!cshims_atomic_test_and_set_bit(field, bit, CSHIMS_ORDER_SEQ_CST));
        CHECK(field[bit >> 3] & (0x80u >> (bit & 7)));
    }
    int all = 1;
    for (size_t i = 0; i < sizeof field; i++) all &= field[i] == 0xFF;
    CHECK(all);
}

static void words(void) {
    int orders[] = {CSHIMS_ORDER_RELAXED, CSHIMS_ORDER_ACQUIRE, CSHIMS_ORDER_RELEASE,
                    CSHIMS_ORDER_ACQ_REL, CSHIMS_ORDER_SEQ_CST};
    for (size_t i = 0; i < sizeof orders / sizeof orders[0]; i++) {
        int o = orders[i];
        uint32_t a = 0;
        CHECK(cshims_atomic_fetch_add_u32(&a, 5, o) == 0 && a == 5);
        CHECK(cshims_atomic_fetch_add_u32(&a, (uint32_t)-7, o) == 5 && (int32_t)a == -2);
        CHECK(cshims_atomic_fetch_or_u32(&a, 0xF0, o) == (uint32_t)-2);
        a = 0xC;
        CHECK(cshims_atomic_fetch_and_u32(&a, 0x6, o) == 0xC && a == 0x4);
        CHECK(cshims_atomic_fetch_xor_u32(&a, 0x5, o) == 0x4 && a == 0x1);
        CHECK(cshims_atomic_exchange_u32(&a, 9, o) == 1 && a == 9);

        uint64_t b = 0;
        CHECK(cshims_atomic_fetch_add_u64(&b, 1ull << 40, o) == 0 && b == 1ull << 40);
        CHECK(cshims_atomic_fetch_or_u64(&b, 1ull << 63, o) == 1ull << 40);
        CHECK(cshims_atomic_fetch_and_u64(&b, 1ull << 63, o) == ((1ull << 63) | (1ull << 40)));
        CHECK(cshims_atomic_fetch_xor_u64(&b, 1ull << 63, o) == 1ull << 63 && b == 0);
        uint64_t e = 0;
        CHECK(cshims_atomic_cas_u64(&b, &e, ~0ull, o) && b == ~0ull);
        e = 0;
        CHECK(!cshims_atomic_cas_u64(&b, &e, 1, o) && e == ~0ull);
        cshims_atomic_store_u64(&b, 77, o == CSHIMS_ORDER_ACQUIRE || o == CSHIMS_ORDER_ACQ_REL ? CSHIMS_ORDER_RELEASE : o);
        CHECK(cshims_atomic_load_u64(&b, o == CSHIMS_ORDER_RELEASE || o == CSHIMS_ORDER_ACQ_REL ? CSHIMS_ORDER_ACQUIRE : o) == 77);

        uintptr_t p = 0;
        uintptr_t pe = 0;
        CHECK(cshims_atomic_cas_uptr(&p, &pe, (uintptr_t)&p, o) && p == (uintptr_t)&p);
        CHECK(cshims_atomic_fetch_add_uptr(&p, 8, o) == (uintptr_t)&p);
        // A weak CAS may fail spuriously; it must succeed within a few tries.
        uint32_t w = 3, we;
        int ok = 0;
        for (int t = 0; t < 100 && !ok; t++) { we = 3; ok = cshims_atomic_cas_weak_u32(&w, &we, 4, o); }
        CHECK(ok && w == 4);
    }
}

static void barriers_and_hint(void) {
    // They must assemble for this architecture and return.
    cshims_barrier_full();
    cshims_barrier_load();
    cshims_barrier_store();
    cshims_barrier_compiler();
    cshims_fence(CSHIMS_ORDER_ACQUIRE);
    cshims_fence(CSHIMS_ORDER_RELEASE);
    for (int i = 0; i < 10; i++) cshims_spin_hint();
    passed++;
}

static void futex(void) {
    uint32_t word = 0;
    int64_t now = cshims_monotonic_now_ns();
    CHECK(cshims_futex_wait(&word, 1, -1, false) == -EAGAIN);       // value differs
    CHECK(cshims_futex_wait(&word, 0, now - 1, false) == -ETIMEDOUT); // deadline in the past
    CHECK(cshims_futex_wait(&word, 0, now + 2000000, true) == -ETIMEDOUT);
    CHECK(cshims_monotonic_now_ns() - now >= 2000000);
    CHECK(cshims_futex_wake(&word, 1, false) == 0);
    CHECK(cshims_futex_wake(&word, 1, true) == 0);
}

int main(void) {
    listing_4_1();
    bit_order();
    words();
    barriers_and_hint();
    futex();
#if defined(__aarch64__)
    const char *arch = "aarch64";
#else
    const char *arch = "x86_64";
#endif
    printf("shims_check (%s): %d passed, %d failed\n", arch, passed, failed);
    return failed == 0 ? 0 : 1;
}
