/// The alignment of the blocks that hold Spindle's lock and futex words: one
/// x86_64 (and common AArch64) cache line, so that a lock's words share a
/// line with nothing else and a waker touches one line.
@usableFromInline
internal let stableWordsAlignment = 64

/// Allocates a zeroed block of `byteCount` bytes (rounded up to whole cache
/// lines), aligned to a cache line, for words that threads reach through
/// atomics and the kernel. The address never changes; the owning object frees
/// it with `deallocateStableWords(_:)` in its `deinit`.
///
/// A plain `malloc` of one line more, aligned by hand, not an aligned
/// allocation: glibc's `memalign` carves the block out of a larger one and
/// frees the rest, which merges into the top chunk and consolidates every
/// fast bin. Measured: 11% of a skynet run (10^6 leaves, a group per inner
/// node) went to that in `WorkGroup.init`. The cost is up to one line of
/// memory per block; the start of the allocation is kept in the word just
/// below the aligned block.
internal func allocateStableWords(byteCount: Int) -> UnsafeMutableRawPointer {
    let lines = (max(byteCount, 1) + stableWordsAlignment - 1) / stableWordsAlignment
    let size = lines * stableWordsAlignment
    let pointerSize = MemoryLayout<UnsafeMutableRawPointer>.size
    // malloc's alignment (16) leaves at least 16 bytes below the aligned
    // block for the start pointer, and at most one line.
    let start = UnsafeMutableRawPointer.allocate(byteCount: size + stableWordsAlignment, alignment: 2 * pointerSize)
    let block = (start + pointerSize).alignedUp(toMultipleOf: stableWordsAlignment)
    (block - pointerSize).storeBytes(of: start, as: UnsafeMutableRawPointer.self)
    block.initializeMemory(as: UInt8.self, repeating: 0, count: size)
    return block
}

/// Frees a block from `allocateStableWords(byteCount:)`.
internal func deallocateStableWords(_ block: UnsafeMutableRawPointer) {
    (block - MemoryLayout<UnsafeMutableRawPointer>.size).load(as: UnsafeMutableRawPointer.self).deallocate()
}
