import Spindle

// Small deterministic generators for stress tests, one per thread, so that a
// failing mix can be replayed from its seed.

/// SplitMix64: a `RandomNumberGenerator` whose whole state is one word.
public struct SplitMix: RandomNumberGenerator {
    public var state: UInt64
    public init(state: UInt64) { self.state = state }
    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// Xorshift64 with a bounded draw (`next(bound)`, modulo: a bias too small
/// to matter for picking test operations).
public struct XorShift {
    public var state: UInt64
    public init(seed: Int) { state = UInt64(truncatingIfNeeded: seed) &* 0x9E37_79B9_7F4A_7C15 | 1 }
    public mutating func next(_ bound: Int) -> Int {
        state ^= state << 13
        state ^= state >> 7
        state ^= state << 17
        return Int(state % UInt64(bound))
    }
}

/// Per-index counters that any thread may bump (sequentially consistent
/// atomics on a zeroed array).
public final class AtomicCounters: @unchecked Sendable {
    // @unchecked: the words are only accessed through AtomicMemory.
    private let words: UnsafeMutablePointer<Int>
    public let count: Int
    public init(_ count: Int) {
        self.count = count
        words = .allocate(capacity: count)
        words.initialize(repeating: 0, count: count)
    }
    deinit { words.deallocate() }
    /// Adds `amount` to counter `index`; returns the new value.
    @discardableResult
    public func add(_ index: Int, _ amount: Int = 1) -> Int {
        AtomicMemory.add(amount, to: words + index, ordering: .sequentiallyConsistent)
    }
    public subscript(index: Int) -> Int { AtomicMemory.load(from: words + index, ordering: .sequentiallyConsistent) }
}
