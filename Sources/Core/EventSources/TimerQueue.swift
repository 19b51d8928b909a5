/// The reactor's timers: one binary heap, ordered by the latest moment each
/// may fire (its due time plus its leeway), behind a single `LoopTimer`
/// whose date is the heap's top. So however many timer sources run on work
/// queues, the reactor's loop has one timer and one kernel timeout, and
/// adding, firing or removing a timer costs O(log n).
///
/// At each wake-up every entry whose latest moment has come fires; an entry
/// is never fired before its due time, and fires at most its leeway late
/// (plus the wake-up's own latency), so timers whose windows overlap share
/// a wake-up. Entries are removed lazily: a cancelled or moved timer's entry
/// is dropped when it reaches the top.
final class TimerQueue: @unchecked Sendable {
    // @unchecked: `heap`, `nextSerial` and `timer` are guarded by `lock`.

    /// One pending firing of one timer source.
    struct Entry: HeapOrdered {
        /// Due time plus leeway, monotonic nanoseconds: the heap's order.
        var latest: Int64
        /// Breaks ties in insertion order.
        var serial: UInt64
        let owner: TimerWatch
        /// The owner's arming this entry belongs to; stale once it changes.
        let arming: Int

        func isBefore(_ other: Entry) -> Bool {
            latest != other.latest ? latest < other.latest : serial < other.serial
        }
    }

    static let shared = TimerQueue()

    private let lock = GuardLock()
    private var heap = MinHeap<Entry>()
    private var nextSerial: UInt64 = 0
    /// The reactor timer, made on first use; a repeating timer whose date is
    /// moved to the heap's top (its own interval is only a fallback).
    private var timer: LoopTimer?

    /// Schedules `owner` to be asked to fire by `latest` (monotonic
    /// nanoseconds). Any thread; wakes the reactor if this is the new top.
    func schedule(_ owner: TimerWatch, latest: Int64, arming: Int) {
        // The timer's date is moved under `lock`, so that two threads that
        // each push a new top cannot leave the later date in place (lock
        // order: this lock, then the reactor loop's, which `fireDate` and
        // `add` take; the loop never calls in here holding its own).
        lock.withLock {
            let timer = self.timer ?? makeTimer()
            nextSerial &+= 1
            heap.push(Entry(latest: latest, serial: nextSerial, owner: owner, arming: arming))
            if heap.first?.serial == nextSerial { timer.fireDate = MonotonicClock.Instant(nanoseconds: latest) }
        }
    }

    /// Under `lock`.
    private func makeTimer() -> LoopTimer {
        let made = LoopTimer(fireAt: .distantFuture, interval: .seconds(3600)) { [unowned self] _ in
            self.fireDue()
        }
        timer = made
        EventReactor.loop.add(made)
        return made
    }

    /// On the reactor, when the timer fires: pops every entry whose latest
    /// moment has come, lets each owner fire (which may schedule it again),
    /// then moves the timer to the new top.
    private func fireDue() {
        let now = MonotonicClock.now.nanoseconds
        var due: [Entry] = []
        lock.withLock {
            while let top = heap.first, top.latest <= now { due.append(heap.popFirst()) }
        }
        for entry in due { entry.owner.fireFromQueue(arming: entry.arming) }
        lock.withLock {
            timer?.fireDate = MonotonicClock.Instant(nanoseconds: heap.first?.latest ?? .max)
        }
    }

    /// In a child after `fork()`: the reactor is gone; so are its timers.
    func childAfterFork() {
        lock.reinitializeAfterFork()
        if let timer { _ = Unmanaged.passRetained(timer) }
        timer = nil
        heap.removeAll()
    }
}
