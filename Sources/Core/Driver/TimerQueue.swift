/// The timers of sources whose handlers run on work queues: one binary heap,
/// ordered by the latest moment each may fire (its due time plus its
/// leeway), whose top is the deadline of the standard pool's poller (see
/// `PoolPoller`): the idle worker that holds it sleeps until then and fires
/// what is due itself, so a timer's handler starts on the thread that woke
/// for it. However many timer sources run on work queues, there is one
/// deadline and one kernel timeout, and adding, firing or removing a timer
/// costs O(log n).
///
/// At each wake-up every entry whose latest moment has come fires; an entry
/// is never fired before its due time, and fires at most its leeway late
/// (plus the wake-up's own latency), so timers whose windows overlap share
/// a wake-up. Entries are removed lazily: a cancelled or moved timer's entry
/// is dropped when it reaches the top.
final class TimerQueue: PoolPoller.Timers, @unchecked Sendable {
    // @unchecked: `heap` and `nextSerial` are guarded by `lock`.

    /// What owns an entry: a timer the heap asks to fire when the entry's
    /// latest moment comes (the event sources' `TimerWatch`, a layer above).
    protocol Owner: AnyObject, Sendable {
        /// The heap reached the entry of `arming` (on the poller's holder);
        /// the owner fires, and may schedule itself again.
        func fireFromQueue(arming: Int)
    }

    /// One pending firing of one timer source.
    struct Entry: HeapOrdered {
        /// Due time plus leeway, monotonic nanoseconds: the heap's order.
        var latest: Int64
        /// Breaks ties in insertion order.
        var serial: UInt64
        let owner: any Owner
        /// The owner's arming this entry belongs to; stale once it changes.
        let arming: Int

        func isBefore(_ other: Entry) -> Bool {
            latest != other.latest ? latest < other.latest : serial < other.serial
        }
    }

    private let lock = GuardLock()
    private var heap = MinHeap<Entry>()
    private var nextSerial: UInt64 = 0
    /// The poller that waits for the heap's top.
    private let poller: PoolPoller

    /// A heap whose deadline `poller` waits for (installed in it).
    init(poller: PoolPoller) {
        self.poller = poller
        poller.install(self)
    }

    /// Schedules `owner` to be asked to fire by `latest` (monotonic
    /// nanoseconds). Any thread; if this is the new top, the poller's holder
    /// looks again (or a worker is woken to hold it). Throws when the
    /// poller has no epoll instance to wait in and the kernel refuses one.
    func schedule(_ owner: any Owner, latest: Int64, arming: Int) throws(SystemCallError) {
        try poller.prepare()
        let first: Bool = lock.withLock {
            nextSerial &+= 1
            heap.push(Entry(latest: latest, serial: nextSerial, owner: owner, arming: arming))
            return heap.first?.serial == nextSerial
        }
        poller.timersChanged(added: 1, newFirst: first)
    }

    func nextDeadline() -> MonotonicClock.Instant? {
        lock.withLock { heap.first.map { MonotonicClock.Instant(nanoseconds: $0.latest) } }
    }

    /// On the poller's holder: pops every entry whose latest moment has
    /// come and lets each owner fire (which may schedule it again).
    func fireDue() -> Bool {
        let now = MonotonicClock.now.nanoseconds
        var due: [Entry] = []
        lock.withLock {
            while let top = heap.first, top.latest <= now { due.append(heap.popFirst()) }
        }
        guard !due.isEmpty else { return false }
        poller.timersChanged(added: -due.count, newFirst: false)
        for entry in due { entry.owner.fireFromQueue(arming: entry.arming) }
        return true
    }

    /// In a child after `fork()`: the parent's timers are not the child's.
    func childAfterFork() {
        lock.reinitializeAfterFork()
        heap.removeAll()
    }
}
