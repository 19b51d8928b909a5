import CShims

// Memory barriers. A barrier orders memory accesses on its own; it is not
// tied to a particular word the way an atomic's ordering is.
//
// ThreadSanitizer models atomics, not fences: it does not see
// `memoryBarrier()`, `loadBarrier()` or `storeBarrier()` (inline assembly)
// and ignores `acquireBarrier()`/`releaseBarrier()`. Code that relies on
// them for correctness will be reported as racy; Spindle's own primitives
// order through atomic operations instead.

/// A full memory barrier (the guide's `OSMemoryBarrier`): every load and
/// store before it is performed before any load or store after it, as seen
/// by every other CPU. This is the only kind of barrier that orders an
/// earlier store before a later load. Also a compiler barrier. Does not block.
///
/// A sequentially consistent fence (`__atomic_thread_fence`): on x86_64 the
/// compiler emits a locked no-op on the stack (`lock or`), which orders all
/// ordinary (write-back) memory like `mfence` at a tenth of the cost (1.9 vs
/// 20 ns here, `scripts/bench --filter fence`); on AArch64 `dmb ish`. For
/// non-temporal stores or write-combining memory use `hardwareMemoryBarrier()`.
@inlinable
public func memoryBarrier() {
    cshims_fence(Int32(CSHIMS_ORDER_SEQ_CST.rawValue))
}

/// The full barrier instruction itself: x86_64 `mfence`, AArch64 `dmb ish`.
/// Unlike `memoryBarrier()` it also orders non-temporal stores and accesses
/// to write-combining memory (device buffers), at ~20 ns on x86_64. Does not
/// block.
@inlinable
public func hardwareMemoryBarrier() {
    cshims_barrier_full()
}

/// A hardware load barrier: loads before it are performed before loads after
/// it. x86_64 `lfence` (ordinary x86 loads are already ordered; it matters for
/// weakly ordered memory and as a speculation barrier); AArch64 `dmb ishld`,
/// which also keeps earlier loads before later stores. Does not block.
@inlinable
public func loadBarrier() {
    cshims_barrier_load()
}

/// A hardware store barrier: stores before it become visible before stores
/// after it. x86_64 `sfence` (ordinary x86 stores are already ordered; it
/// matters for non-temporal stores); AArch64 `dmb ishst`. Does not block.
@inlinable
public func storeBarrier() {
    cshims_barrier_store()
}

/// An acquire fence: loads before it are not reordered with any load or store
/// after it. Pairs with a `releaseBarrier()` (or a releasing atomic) in the
/// thread that wrote what a load before this fence read. Free on x86_64
/// (compiler barrier only); `dmb ishld` on AArch64. Does not block.
@inlinable
public func acquireBarrier() {
    cshims_fence(Int32(CSHIMS_ORDER_ACQUIRE.rawValue))
}

/// A release fence: loads and stores before it are not reordered with any
/// store after it. Pairs with an `acquireBarrier()` (or an acquiring atomic)
/// in the thread that reads what a store after this fence wrote. Free on
/// x86_64 (compiler barrier only); `dmb ish` on AArch64. Does not block.
@inlinable
public func releaseBarrier() {
    cshims_fence(Int32(CSHIMS_ORDER_RELEASE.rawValue))
}

/// A compiler barrier: the compiler keeps memory accesses on their side of
/// it, but the CPU may still reorder them. Emits no instruction. Useful
/// against a signal handler on the same thread. Does not block.
@inlinable
public func compilerBarrier() {
    cshims_barrier_compiler()
}

/// Tells the CPU the caller is in a spin-wait loop: x86_64 `pause`, AArch64
/// `isb`. Delays the caller for a few tens of cycles; never blocks or yields
/// the CPU to another thread.
///
/// Why `isb` and not `yield` on AArch64: on the Neoverse and Cortex-A7x
/// cores that run Linux servers, `yield` retires as a one-cycle no-op, so a
/// spin loop built on it keeps hammering the contended cache line, while
/// `isb` drains the pipeline and stalls for tens of cycles, the back-off a
/// spin wants (the choice Rust's `spin_loop`, HotSpot's `onSpinWait` and
/// MySQL make on AArch64). That rests on those projects' measurements, not
/// Spindle's: it has not been timed on AArch64 hardware (timings under qemu
/// mean nothing). `scripts/cross-aarch64` checks that the AArch64 build
/// emits `dmb ish`, `dmb ishld`, `dmb ishst` and `isb`, and that its
/// results match x86_64's.
@inlinable
public func spinLoopHint() {
    cshims_spin_hint()
}
