import CShims

/// A worker pool's watch over workers that block where Spindle cannot see
/// (a plain `read()`, a pthread or Foundation lock, `usleep`): Go's `sysmon`
/// retaking the P of a thread stuck in a system call, with the kernel as the
/// witness instead of a system-call wrapper.
///
/// ## What it does
/// Every `period` while the pool is busy, the monitor's thread reads each
/// worker's progress word (see `PoolWorker.Progress`). A worker that is
/// running the same unit as at the last look, outside any Spindle wait, and
/// that the kernel reports asleep (`/proc/self/task/<tid>/stat` not `R`) is
/// *blocked*: its permit is lent to the pool (the count of active workers
/// drops by one), and if work is queued a worker is woken or started to run
/// it, within the pool's thread bound (`maximumThreads`). A worker that
/// computes for long is running (`R`) and lends nothing, so CPU-bound items
/// never make the pool wider than the machine. At the next look after the
/// worker moves on, the permit comes back (the count rises again), and a
/// worker beyond the width parks after its item (the pool's over-width
/// check); workers beyond the width exit after `WorkerPool.idleExit`.
///
/// It also wakes a parked worker for a unit that sat in a worker's
/// next-unit slot through a whole period (a fill the slot's back-off left
/// unannounced, see `NextUnitSlot.announcesFill`, whose owner kept
/// running), which takes it at once (`PoolWorker.wakeHint`).
///
/// It is also the event driver's backstop for the one case the poller's
/// eager hand-off cannot cover (see `PoolPoller`): every worker computing,
/// with no permit free to hand the poller to. At each look, if something
/// is watched and nobody holds the standard pool's poller, it polls it
/// without waiting and queues the calls of what it found, so an event is
/// taken from the kernel within one period while the workers compute.
///
/// ## Bound
/// An item queued behind workers blocked outside Spindle starts within two
/// periods of the moment they blocked (one to see each worker's unit, one
/// to see it unchanged), plus a thread start if no worker is parked.
///
/// ## Cost
/// Two relaxed stores per unit on the worker's own cache line (its progress
/// word, before and after the unit). The monitor's thread is started on
/// the pool's first wake-up and sleeps on its futex whenever every worker
/// of the pool is parked (the look after they all parked disarms it; the
/// next wake-up of a worker arms it): an idle pool costs no wake-ups. A
/// busy one costs one wake-up per `period` and one `/proc` read per worker
/// that has run one unit for a whole period.
///
/// ## Ordering
/// None of it orders the items' memory: the words are hints, read and
/// written relaxed, and the lent count is corrected at every look. Arming
/// and disarming form a Dekker pair with the waker (`armIfAsleep`): the
/// waker raises `active` and then reads the armed word; the monitor clears
/// the armed word and then reads `active`, both sequentially consistent.
final class PoolMonitor: @unchecked Sendable {
    // @unchecked: `lent` and the workers' `monitorLastLook` are touched by
    // the monitor's thread alone, `started` under the pool's lock; the
    // armed and looks words are atomic.

    /// How often a busy pool is looked at. .NET's starvation detection
    /// checks every 500 ms; Go's sysmon from every 20 µs up to 10 ms. 10 ms
    /// bounds the wait behind blocked workers at 20 ms and costs a busy
    /// pool 100 wake-ups a second, which no row of Bench can see.
    static let period: Duration = .milliseconds(10)

    private unowned(unsafe) let pool: WorkerPool
    /// 1 while armed (the pool has run a worker since the monitor last found
    /// every worker parked), 0 asleep. The monitor's futex word.
    private let armedWord: UnsafeMutablePointer<UInt32>
    /// Whether the monitor's thread exists. Under the pool's lock.
    private var started = false
    /// Permits lent for blocked workers at the last look. Monitor only.
    private var lent = 0
    /// Looks taken (tests: an idle pool takes none).
    private let looksWord: UnsafeMutablePointer<Int>

    init(pool: WorkerPool) {
        self.pool = pool
        let words = allocateStableWords(byteCount: 64)
        armedWord = words.assumingMemoryBound(to: UInt32.self)
        looksWord = (words + 8).assumingMemoryBound(to: Int.self)
    }

    /// Looks taken since the process started (or forked).
    package var looks: Int { AtomicMemory.load(from: looksWord, ordering: .relaxed) }

    /// Whether the monitor is armed now (tests).
    package var isArmed: Bool { AtomicMemory.load(from: armedWord, ordering: .relaxed) != 0 }

    /// Called by a waker after it raised the pool's `active` count, with
    /// the pool's lock held: wakes the monitor if it sleeps, starting its
    /// thread the first time. Returns whether the thread must be started
    /// (the caller does that after unlocking, with `startThread`).
    @inline(__always)
    func armIfAsleep() -> Bool {
        // Sequentially consistent: the waker's half of the Dekker pair with
        // `disarm` (the waker's `active` add came first).
        guard AtomicMemory.load(from: armedWord, ordering: .sequentiallyConsistent) == 0 else { return false }
        AtomicMemory.store(1, to: armedWord, ordering: .sequentiallyConsistent)
        if !started {
            started = true
            return true
        }
        Futex(armedWord).wake()
        return false
    }

    /// Starts the monitor's thread (after `armIfAsleep` said so). A machine
    /// that refuses the thread leaves the pool without the monitor: items
    /// behind blocked workers then wait for them, as they did before.
    func startThread() {
        var attributes = NativeThread.Attributes()
        attributes.name = "spindle.mon.\(pool.band.threadName)"
        do {
            try NativeThread.detach(attributes) { [self] in self.run() }
        } catch {
            pool.lock.lock()
            started = false
            AtomicMemory.store(0, to: armedWord, ordering: .relaxed)
            pool.lock.unlock()
        }
    }

    private func run() {
        let futex = Futex(armedWord)
        while true {
            if AtomicMemory.load(from: armedWord, ordering: .acquiring) == 0 {
                _ = futex.wait(expecting: 0)
                continue
            }
            _ = futex.wait(expecting: 1, until: MonotonicClock.now.advanced(by: Self.period))
            look()
        }
    }

    /// One look at every worker (see the type's doc).
    private func look() {
        AtomicMemory.add(1, to: looksWord, ordering: .relaxed)
        var blocked = 0
        var anyRunning = false
        var staleSlot: PoolWorker?
        for worker in pool.workerSnapshot() {
            let word = worker.progress
            let previous = worker.monitorLastLook
            worker.monitorLastLook = word
            // A unit that sat in a slot through a whole period: a fill left
            // unannounced (`NextUnitSlot.announcesFill`) whose owner kept
            // running.
            let slotWord = worker.slot.fullWord ?? 0
            if slotWord != 0 && slotWord == worker.monitorLastSlot { staleSlot = worker }
            worker.monitorLastSlot = slotWord
            worker.slot.resetBackoff()
            switch PoolWorker.Progress.state(of: word) {
            case .idle:
                continue
            case .inSpindleWait:
                anyRunning = true
            case .running:
                anyRunning = true
                if previous == word && worker.isAsleepInKernel { blocked += 1 }
            }
        }
        if blocked != lent {
            // Lend the permits of blocked workers, take back those of
            // workers that moved on.
            AtomicMemory.add(lent - blocked, to: pool.active, ordering: .sequentiallyConsistent)
            lent = blocked
        }
        if let staleSlot, pool.wakeWouldStart { pool.wakeOne(forSlotOf: staleSlot) }
        // The driver's backstop: nobody at the poller while workers run.
        if let poller = pool.poller, poller.wantsHolder { poller.pollIfUnheld() }
        if blocked > 0 && pool.hasQueuedWork() { pool.notifyIfNeeded() }
        if !anyRunning && lent == 0 { disarm() }
    }

    /// Every worker is parked: sleep until the next wake-up arms the
    /// monitor, unless one came meanwhile (the Dekker pair's other half).
    private func disarm() {
        AtomicMemory.store(0, to: armedWord, ordering: .sequentiallyConsistent)
        if AtomicMemory.load(from: pool.active, ordering: .sequentiallyConsistent) > 0 {
            AtomicMemory.store(1, to: armedWord, ordering: .relaxed)
        }
    }

    /// In a child after `fork()`: the monitor's thread is gone; the next
    /// wake-up starts another. The pool resets its `active` count itself,
    /// so nothing lent survives.
    func childAfterFork() {
        started = false
        lent = 0
        AtomicMemory.store(0, to: armedWord, ordering: .relaxed)
    }
}
