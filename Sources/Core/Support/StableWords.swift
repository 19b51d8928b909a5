/// The alignment of the blocks that hold Spindle's lock and futex words: one
/// x86_64 (and common AArch64) cache line, so that a lock's words share a
/// line with nothing else and a waker touches one line.
@usableFromInline
internal let stableWordsAlignment = 64

/// Allocates a zeroed block of `byteCount` bytes (rounded up to whole cache
/// lines), aligned to a cache line, for words that threads reach through
/// atomics and the kernel. The address never changes; the owning object frees
/// it with `deallocate()` in its `deinit`.
internal func allocateStableWords(byteCount: Int) -> UnsafeMutableRawPointer {
    let lines = (max(byteCount, 1) + stableWordsAlignment - 1) / stableWordsAlignment
    let size = lines * stableWordsAlignment
    let block = UnsafeMutableRawPointer.allocate(byteCount: size, alignment: stableWordsAlignment)
    block.initializeMemory(as: UInt8.self, repeating: 0, count: size)
    return block
}
