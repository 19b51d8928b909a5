/// The size of the cache line that a benchmarked word gets to itself. 128
/// rather than 64: Intel's adjacent-line prefetcher pulls lines in pairs, and
/// Apple's and some Arm cores have 128-byte lines.
public let cacheLineSize = 128

/// Allocates a `T` alone on its own cache line(s), initialized to `value`,
/// and returns its address, which never changes.
///
/// Atomics, lock words and Synchronization's `Atomic`/`Mutex` must not move,
/// and a benchmark must not let two of them share a line (false sharing would
/// measure the neighbour). Every implementation of a group gets its state
/// from here, so placement is the same for all of them.
///
/// The memory is never freed: benchmarks register once per process and
/// their state lives as long as the process.
public func allocateOnOwnCacheLine<T: ~Copyable>(_ value: consuming T) -> UnsafeMutablePointer<T> {
    let bytes = max(MemoryLayout<T>.stride, 1)
    let lines = (bytes + cacheLineSize - 1) / cacheLineSize
    let alignment = max(MemoryLayout<T>.alignment, cacheLineSize)
    let raw = UnsafeMutableRawPointer.allocate(byteCount: lines * cacheLineSize, alignment: alignment)
    let typed = raw.bindMemory(to: T.self, capacity: 1)
    typed.initialize(to: value)
    return typed
}
