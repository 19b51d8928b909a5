/// A growable ring of work units: FIFO at both ends. Not synchronized: its
/// owner guards it with a lock. `count` is also published in an atomic word
/// so that other threads may ask "is anything here?" without the lock (an
/// answer that is immediately stale, for wake-up decisions only).
final class WorkRing {
    private var storage: UnsafeMutablePointer<WorkUnit>
    private var capacity: Int
    private var head = 0
    private(set) var count = 0
    /// `count`, for readers without the lock (sequentially consistent: the
    /// pool's Dekker-style checks pair with it). Only the pool's rings
    /// publish; a queue's ring is read under its lock alone.
    let publishedCount: UnsafeMutablePointer<Int>
    private let publishes: Bool

    init(capacity: Int = 16, publishesCount: Bool = false) {
        publishes = publishesCount
        self.capacity = capacity
        storage = .allocate(capacity: capacity)
        publishedCount = .allocate(capacity: 1)
        publishedCount.initialize(to: 0)
    }

    deinit {
        for i in 0..<count { (storage + (head + i) & (capacity - 1)).deinitialize(count: 1) }
        storage.deallocate()
        publishedCount.deallocate()
    }

    var isEmpty: Bool { count == 0 }

    @inline(__always)
    private func publish() {
        guard publishes else { return }
        AtomicMemory.store(count, to: publishedCount, ordering: .sequentiallyConsistent)
    }

    /// Appends at the back.
    @inline(__always)
    func pushBack(_ unit: consuming WorkUnit) {
        if count == capacity { grow() }
        (storage + (head + count) & (capacity - 1)).initialize(to: unit)
        count += 1
        publish()
    }

    /// Inserts at the front (a unit that must run next).
    func pushFront(_ unit: consuming WorkUnit) {
        if count == capacity { grow() }
        head = (head - 1) & (capacity - 1)
        (storage + head).initialize(to: unit)
        count += 1
        publish()
    }

    /// Removes the front unit.
    @inline(__always)
    func popFront() -> WorkUnit? {
        guard count > 0 else { return nil }
        let unit = (storage + head).move()
        head = (head + 1) & (capacity - 1)
        count -= 1
        publish()
        return unit
    }

    /// Whether the front unit is a barrier (false when empty).
    var frontIsBarrier: Bool {
        count > 0 && storage[head].isBarrier
    }

    /// Moves up to `limit` units from the front into `buffer`; returns how many.
    func popFront(into buffer: UnsafeMutablePointer<WorkUnit>, limit: Int) -> Int {
        let n = min(limit, count)
        for i in 0..<n {
            (buffer + i).initialize(to: (storage + head).move())
            head = (head + 1) & (capacity - 1)
        }
        count -= n
        publish()
        return n
    }

    /// Removes every unit, in order.
    func removeAll() -> [WorkUnit] {
        var all: [WorkUnit] = []
        all.reserveCapacity(count)
        while let unit = popFront() { all.append(unit) }
        return all
    }

    private func grow() {
        let bigger = UnsafeMutablePointer<WorkUnit>.allocate(capacity: capacity * 2)
        for i in 0..<count {
            (bigger + i).initialize(to: (storage + (head + i) & (capacity - 1)).move())
        }
        storage.deallocate()
        storage = bigger
        capacity *= 2
        head = 0
    }
}
