import Spindle

/// A log of integers in the order appended, on a Spindle lock (the queues'
/// ordering is what is under test, not the lock).
public final class OrderLog: @unchecked Sendable {
    private let lock = Lock()
    private var values: [Int] = []
    public init() {}
    public func append(_ v: Int) { lock.withLock { values.append(v) } }
    public var all: [Int] { lock.withLock { values } }
    public var count: Int { lock.withLock { values.count } }
}

/// Counts items running at once and remembers the most seen.
public final class Occupancy: @unchecked Sendable {
    private let word = UnsafeMutablePointer<Int>.allocate(capacity: 1)
    private let peakWord = UnsafeMutablePointer<Int>.allocate(capacity: 1)
    public init() {
        word.initialize(to: 0)
        peakWord.initialize(to: 0)
    }
    deinit {
        word.deallocate()
        peakWord.deallocate()
    }
    public func enter() -> Int {
        let now = AtomicMemory.add(1, to: word, ordering: .acquiringAndReleasing)
        var peak = AtomicMemory.load(from: peakWord, ordering: .relaxed)
        while now > peak {
            let r = AtomicMemory.compareExchange(expected: peak, desired: now, at: peakWord, ordering: .relaxed)
            if r.exchanged { break }
            peak = r.original
        }
        return now
    }
    public func leave() { AtomicMemory.add(-1, to: word, ordering: .acquiringAndReleasing) }
    public var peak: Int { AtomicMemory.load(from: peakWord, ordering: .relaxed) }
}

