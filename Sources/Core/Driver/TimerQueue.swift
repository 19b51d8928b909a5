import Synchronization

/// The timers of the standard pool's poller: the timer sources whose
/// handlers run on work queues and the units submitted with
/// `WorkQueue.async(after:)` (and the global executor's timed jobs), in one
/// structure whose first deadline is the deadline of the standard pool's
/// poller (see `PoolPoller`): the idle worker that holds it sleeps until
/// then and fires what is due itself, so a timer's handler starts on the
/// thread that woke for it. However many timers wait, there is one deadline
/// and one kernel timeout, and adding, firing or removing one costs
/// O(log n).
///
/// Each entry has a window: its due time and its latest moment (due time
/// plus leeway). Two binary heaps hold them: one ordered by the latest
/// moment, whose top is when the holder must wake; one ordered by due time,
/// holding the entries with a leeway. At every wake-up of the holder (for
/// this heap's deadline, for a descriptor, for new work, a poll between
/// items or the watchdog's) every entry whose due time has come fires. So
/// an entry never fires before its due time, fires at most its leeway late
/// (plus the wake-up's own latency), and fires at its due time when the
/// holder is awake anyway: windows that overlap share one wake-up, at the
/// earliest latest moment among them (libdispatch coalesces the same way).
///
/// Every entry is a `Slot` that knows its place in both heaps, so a
/// cancelled delayed submission leaves at once (`remove`). A timer source's
/// older entries are not removed: a stale arming fires as nothing.
/// Delayed submissions survive `fork()`; timer sources' entries do not.
final class TimerQueue: PoolPoller.Timers, @unchecked Sendable {
    // @unchecked: the heaps, `nextSerial` and `delayed` are guarded by
    // `lock`, and so is every slot's state while it is in a heap.

    /// What owns an entry: a timer the heap asks to fire when the entry's
    /// window comes (the event sources' `TimerWatch`, a layer above).
    protocol Owner: AnyObject, Sendable {
        /// The heap reached the entry of `arming` (on the poller's holder);
        /// the owner fires, and may schedule itself again.
        func fireFromQueue(arming: Int)
    }

    /// One entry: its window and its places in the two heaps (-1: not in
    /// it). Guarded by the queue's lock while scheduled. Subclassed by
    /// entries that fire themselves (delayed submissions, which `fire`
    /// overrides).
    class Slot: @unchecked Sendable {
        // @unchecked: the fields below are guarded by the TimerQueue's lock.
        fileprivate var latestIndex = -1
        fileprivate var dueIndex = -1
        fileprivate var due: Int64 = 0
        fileprivate var latest: Int64 = 0
        fileprivate var serial: UInt64 = 0
        /// Kept in a child after `fork()`, and counted in `delayedCount`.
        fileprivate var survivesFork: Bool { false }
        init() {}

        /// The window came (on the poller's holder, or the watchdog's
        /// thread), outside the queue's lock.
        func fire() {}
    }

    /// A timer source's entry: asks its owner to fire.
    private final class OwnerSlot: Slot, @unchecked Sendable {
        let owner: any Owner
        let arming: Int

        init(owner: any Owner, arming: Int) {
            self.owner = owner
            self.arming = arming
        }

        override func fire() { owner.fireFromQueue(arming: arming) }
    }

    /// A slot that survives fork: a delayed submission's.
    class DelayedSlot: Slot, @unchecked Sendable {
        override fileprivate var survivesFork: Bool { true }
        override init() {}
    }

    /// A slot as the heap of latest moments orders it.
    private struct ByLatest: HeapOrdered {
        let slot: Slot
        func isBefore(_ other: ByLatest) -> Bool {
            slot.latest != other.slot.latest ? slot.latest < other.slot.latest : slot.serial < other.slot.serial
        }
        func placed(at index: Int) { slot.latestIndex = index }
    }

    /// A slot as the heap of due times orders it.
    private struct ByDue: HeapOrdered {
        let slot: Slot
        func isBefore(_ other: ByDue) -> Bool {
            slot.due != other.slot.due ? slot.due < other.slot.due : slot.serial < other.slot.serial
        }
        func placed(at index: Int) { slot.dueIndex = index }
    }

    private let lock = GuardLock()
    /// Every entry, by latest moment: its top is the holder's deadline.
    private var byLatest = MinHeap<ByLatest>()
    /// The entries with a leeway (due before latest), by due time.
    private var byDue = MinHeap<ByDue>()
    private var nextSerial: UInt64 = 0
    /// Entries that survive fork (delayed submissions) in the heaps.
    private var delayed = 0
    /// The poller that waits for the heap's top.
    private let poller: PoolPoller

    /// A heap whose deadline `poller` waits for (installed in it).
    init(poller: PoolPoller) {
        self.poller = poller
        poller.install(self)
    }

    /// Schedules `owner` to be asked to fire, with `arming`, once `due` has
    /// come and by `latest` (monotonic nanoseconds; `latest` ≥ `due`). Any
    /// thread; if this is the new first deadline, the poller's holder looks
    /// again (or a worker is woken to hold it). Throws when the poller has
    /// no epoll instance to wait in and the kernel refuses one.
    func schedule(_ owner: any Owner, due: Int64, latest: Int64, arming: Int) throws(SystemCallError) {
        try schedule(OwnerSlot(owner: owner, arming: arming), due: due, latest: latest)
    }

    /// Schedules `slot` (not scheduled now) to fire in the window
    /// [`due`, `latest`]; see `schedule(_:due:latest:arming:)`.
    func schedule(_ slot: Slot, due: Int64, latest: Int64) throws(SystemCallError) {
        try poller.prepare()
        let first: Bool = lock.withLock {
            nextSerial &+= 1
            slot.due = due
            slot.latest = max(due, latest)
            slot.serial = nextSerial
            byLatest.push(ByLatest(slot: slot))
            if slot.due < slot.latest { byDue.push(ByDue(slot: slot)) }
            if slot.survivesFork { delayed += 1 }
            return byLatest.first?.slot === slot
        }
        poller.timersChanged(added: 1, newFirst: first)
    }

    /// Takes `slot` out of the heaps before it fires: true if it was there
    /// (it will not fire), false if it already fired or was removed.
    /// O(log n). Any thread.
    func remove(_ slot: Slot) -> Bool {
        let removed: Bool = lock.withLock {
            guard slot.latestIndex >= 0 else { return false }
            unlinkLocked(slot)
            return true
        }
        // The holder may wake for the removed deadline once, finds nothing
        // due, and waits for the next one.
        if removed { poller.timersChanged(added: -1, newFirst: false) }
        return removed
    }

    /// Takes `slot` out of both heaps. Under the lock.
    private func unlinkLocked(_ slot: Slot) {
        if slot.latestIndex >= 0 { _ = byLatest.remove(at: slot.latestIndex) }
        if slot.dueIndex >= 0 { _ = byDue.remove(at: slot.dueIndex) }
        if slot.survivesFork { delayed -= 1 }
    }

    /// How many delayed submissions wait in the heaps.
    var delayedCount: Int { lock.withLock { delayed } }

    func nextDeadline() -> MonotonicClock.Instant? {
        lock.withLock { byLatest.first.map { MonotonicClock.Instant(nanoseconds: $0.slot.latest) } }
    }

    /// On the poller's holder (at each of its wake-ups): takes out every
    /// entry whose due time has come (those whose latest moment has, and
    /// those with a leeway whose due time has) and fires each, which may
    /// schedule it again.
    func fireDue() -> Bool {
        let now = MonotonicClock.now.nanoseconds
        var due: [Slot] = []
        lock.withLock {
            while let top = byLatest.first, top.slot.latest <= now {
                due.append(top.slot)
                unlinkLocked(top.slot)
            }
            while let top = byDue.first, top.slot.due <= now {
                due.append(top.slot)
                unlinkLocked(top.slot)
            }
        }
        guard !due.isEmpty else { return false }
        poller.timersChanged(added: -due.count, newFirst: false)
        for slot in due { slot.fire() }
        return true
    }

    /// Whether `prepareForFork` has run the heaps' code in this process.
    private static let heapCodeRun = Atomic<Bool>(false)

    /// In the parent, before `fork()`: the generic types of the heap's code
    /// (`ForkHandlers.makeMetadata`). Both heaps' element types, their
    /// optionals, arrays and iterators: `childAfterFork` runs `MinHeap`'s
    /// generic code for each heap, which a debug build instantiates at run
    /// time, per element type (a forked child hung in `byDue.keepOnly`
    /// making `ByDue?` under the runtime's lock for optionals, which a
    /// parent thread held at the fork; found by a hang in a TSan pass,
    /// 2026-11-28). `MinHeap` calls only `Array`'s own members, so these
    /// are all it looks up (`scripts/check-fork-metadata` checks it).
    static func prepareForFork() {
        ForkHandlers.makeMetadata(
            ByLatest?.self, ByDue?.self, MinHeap<ByLatest>.self, MinHeap<ByDue>.self,
            [ByLatest].self, [ByDue].self,
            IndexingIterator<[ByLatest]>.self, IndexingIterator<[ByDue]>.self,
            [Slot].self, IndexingIterator<[Slot]>.self)
        ForkHandlers.makeConformance(collection: [Slot].self)
        ForkHandlers.makeConformance(rangeReplaceable: [ByLatest].self)
        ForkHandlers.makeConformance(rangeReplaceable: [ByDue].self)
        ForkHandlers.makeConformance(mutable: [ByLatest].self)
        ForkHandlers.makeConformance(mutable: [ByDue].self)
        // `removeAll(keepingCapacity:)` looks up the arrays' random-access
        // conformance, and with it the bidirectional one (a forked child
        // hung there in a TSan pass, 2026-11-28).
        ForkHandlers.makeConformance(randomAccess: [ByLatest].self)
        ForkHandlers.makeConformance(randomAccess: [ByDue].self)
        // And the heaps' code that `childAfterFork` runs, run here on two
        // heaps of four slots of its own (keeping every other one), so that
        // each run-time lookup it makes has been made, from the same code,
        // in the parent before the fork: once per process (what it made
        // stays made).
        guard !heapCodeRun.exchange(true, ordering: .acquiringAndReleasing) else { return }
        var latest = MinHeap<ByLatest>()
        var due = MinHeap<ByDue>()
        for _ in 0..<4 {
            let slot = Slot()
            latest.push(ByLatest(slot: slot))
            due.push(ByDue(slot: slot))
        }
        var keep = false
        latest.keepOnly { _ in keep.toggle(); return keep }
        due.keepOnly { _ in keep.toggle(); return keep }
        latest.removeAll()
        due.removeAll()
    }

    /// In a child after `fork()`: the parent's timer sources are not the
    /// child's, but its delayed submissions are (they run in the child when
    /// due, as the queues they were submitted to go on there). The poller
    /// forgot its count of them (`PoolPoller.childAfterFork`, earlier):
    /// `announceAfterFork` tells it again once the child's handlers ran.
    func childAfterFork() {
        lock.reinitializeAfterFork()
        byLatest.keepOnly { $0.slot.survivesFork }
        byDue.keepOnly { $0.slot.survivesFork }
        delayed = byLatest.count
    }

    /// In a child after `fork()`, after every fork handler: the entries kept
    /// count as watched again, and a worker is woken to hold the poller for
    /// them.
    func announceAfterFork() {
        let kept = lock.withLock { byLatest.count }
        if kept > 0 { poller.timersChanged(added: kept, newFirst: true) }
    }
}
