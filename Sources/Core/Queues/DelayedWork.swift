/// Units submitted with `WorkQueue.async(after:)`, held until their deadline:
/// one binary heap ordered by deadline (then by submission), watched by one
/// thread that sleeps on a futex until the earliest deadline, or until an
/// earlier one arrives. The thread starts with the first delayed unit and
/// then stays, asleep, using no CPU while nothing is due.
///
/// (The event-source reactors that come next keep timers in one structure
/// per reactor too; this is the queues' own, so that `async(after:)` needs
/// no reactor.)
final class DelayedWork: @unchecked Sendable {
    // @unchecked: everything but `generation` is guarded by `lock`.

    static let shared = DelayedWork()

    private struct Entry: HeapOrdered {
        let deadline: MonotonicClock.Instant
        let sequence: UInt64
        let queue: WorkQueue
        let unit: WorkUnit

        func isBefore(_ other: Entry) -> Bool {
            deadline < other.deadline || (deadline == other.deadline && sequence < other.sequence)
        }
    }

    private let lock = GuardLock()
    private var heap = MinHeap<Entry>()
    private var sequence: UInt64 = 0
    private var threadStarted = false
    /// Bumped (and woken) when the earliest deadline changes.
    private let generation: UnsafeMutablePointer<UInt32>

    private init() {
        generation = allocateStableWords(byteCount: 4).assumingMemoryBound(to: UInt32.self)
        _ = WorkerPool.forkHandlersRegistered
    }

    /// Holds `unit` for `queue` until `deadline`. Never blocks.
    func schedule(_ unit: WorkUnit, on queue: WorkQueue, at deadline: MonotonicClock.Instant) {
        lock.lock()
        sequence += 1
        let entry = Entry(deadline: deadline, sequence: sequence, queue: queue, unit: unit)
        heap.push(entry)
        let isEarliest = heap.first?.sequence == entry.sequence
        let start = !threadStarted
        threadStarted = true
        if isEarliest { AtomicMemory.add(1, to: generation, ordering: .releasing) }
        lock.unlock()
        if start { startThread() }
        if isEarliest { Futex(generation).wake() }
    }

    private func startThread() {
        var attributes = NativeThread.Attributes()
        attributes.name = "spindle.delay"
        do {
            try NativeThread.detach(attributes) { [self] in self.run() }
        } catch {
            misuse("WorkQueue.async(after:): cannot start Spindle's delay thread: \(error)")
        }
    }

    private func run() {
        while true {
            lock.lock()
            var due: [Entry] = []
            let now = MonotonicClock.now
            while let first = heap.first, first.deadline <= now { due.append(heap.popFirst()) }
            let next = heap.first?.deadline
            let seen = AtomicMemory.load(from: generation, ordering: .acquiring)
            lock.unlock()
            for entry in due { entry.queue.submit(entry.unit) }
            if due.isEmpty {
                _ = Futex(generation).wait(expecting: seen, until: next)
            }
        }
    }

    /// In a child after `fork()`: the delay thread is gone; the next
    /// `schedule` starts another, and units already held run then.
    func childAfterFork() {
        lock.reinitializeAfterFork()
        threadStarted = false
        if !heap.isEmpty {
            threadStarted = true
            startThread()
        }
    }
}
