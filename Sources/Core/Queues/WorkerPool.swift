import CShims

/// The threads that run work queues' items: one pool per priority band, each
/// `Topology.availableCPUCount` workers wide.
///
/// ## Structure (Tokio's and Go's schedulers are the anchors)
/// - **Permits.** `width` workers may be *active* at once: running an item,
///   or searching for one. A worker takes a permit when it is woken or
///   started, and gives it back when it parks. A worker whose item enters a
///   blocking wait (`BlockingObserver`) gives its permit back for the length
///   of the wait, so the pool can wake or start another worker if work is
///   queued; when the wait ends the worker takes its permit back even if that
///   makes the pool over-full, finishes its item, and then parks if the pool
///   is over width (Go's `entersyscall`/`exitsyscall` hand-off of a P, with
///   the pool's lock instead of an atomic P list).
/// - **Queues.** Each worker has a local ring (`StealableRing`: the owner
///   pushes and pops without a lock, a thief claims the older half with a
///   compare-and-swap); a worker that submits to its own pool pushes there
///   (the submitter runs the work soon, on a warm cache). A continuation
///   (an item's `async` onto a global queue, or the first drain of a
///   serial queue) submitted while the ring is empty goes to the worker's
///   next-unit slot instead (`NextUnitSlot`; Tokio's LIFO slot, Go's
///   `runnext`), which its owner runs next, so a chain of items stays on
///   one worker. The slot is flushed to the ring when the item blocks in a
///   Spindle wait or the worker parks, and after 16 slot runs in a row.
///   Other threads push to the shared injector, in two lanes (high before
///   default; the `standard` band serves both); a worker takes a fair share
///   of the default lane per trip through the lock (Go's `globrunqget`). A
///   worker looks in its slot, the high lane, its own ring, the default
///   lane, then steals half of another worker's ring. A fair look (the
///   poller, then the injector, first) comes every 61st look (Go's
///   `schedtick % 61`), or sooner when the units are long: every look
///   that follows about 200 µs of units, at least every 2nd (Tokio's tuned
///   global queue interval), so a busy local ring cannot starve them.
/// - **How a submitted unit reaches a free worker, and when.** Every
///   submission, to a ring, the injector or a slot, is announced: if no
///   worker is searching and a permit is free, one parked worker is woken
///   (below); a worker woken for a slot fill takes the unit at once if its
///   owner has not taken it back. Slot fills back off their announcements
///   while those wake-ups find nothing (a chain of short items), and the
///   monitor wakes a worker for a unit that sits in a slot through one of
///   its periods, so an unannounced fill waits at most 20 ms. A searcher
///   that finds nothing parks, and on its way (its permit given back)
///   looks at every ring and slot once more: a ring's unit it takes at
///   once; a slot's unit it takes if the slot still holds the same unit
///   after `PoolWorker.slotGrace` (3 µs, Go's back-off before it steals
///   `runnext`). So a unit submitted while a worker is free starts within
///   about one wake-up, whatever its submitter does next; the owner of a
///   chain whose items return within a wake-up keeps the chain, and the
///   cost is a wake-up of a parked worker when a chain step finds nobody
///   searching (Go pays the same in `ready`'s `wakep`), until the slot's
///   back-off thins them out. A unit queued while every permit is held
///   waits for a worker to finish, or, when workers hold their permits
///   while blocked outside Spindle's waits (a plain `read()`), for the
///   pool's monitor (`PoolMonitor`, Go's `sysmon`) to lend their permits
///   to new workers, within two monitor periods (20 ms).
/// - **Spinning.** One worker per pool at a time (whoever takes the spinner
///   word; a count of searchers would let two that check at once both
///   park) spins before parking, for at most `spinBeforePark` (5 µs),
///   polling the rings' published counts: an item that arrives within that
///   window starts without a futex wake. Not longer: a spinner holding one
///   core while the thread it answers must be woken on another, idle one
///   makes hand-offs slower, not faster (see `spinBeforePark`).
/// - **Parking.** On a per-worker futex word. An idle pool uses no CPU. A
///   worker beyond `width` (started to replace blocked ones) exits after
///   `idleExit` without work.
/// - **Event sources.** While the descriptors or timers of sources on work
///   queues are watched, one parked worker of the standard pool waits in
///   the pool's poller (`PoolPoller`, Tokio's I/O driver) instead of on its
///   futex, and runs the calls of what it finds itself, after it woke
///   another parked worker to hold the poller in its place (Tokio's eager
///   driver hand-off); busy workers poll it at each fair look and when
///   they run dry, and while every worker computes the monitor polls it. A
///   waker prefers a parked worker that is not the poller's.
///
/// **On many cores.** A submission from a worker writes only that
/// worker's own lines (its ring's tail or its slot's word) and reads two
/// shared counters (`searching`, `active`) that change only when workers
/// park or wake, so those lines stay shared in every cache; a wake-up (the
/// pool's lock and a futex wake) is paid only when nobody searches, and
/// one spinner at a time polls the rings' counts. A steal writes the
/// victim's `head` line once to claim and once to commit, for up to 64
/// units. A slot's line is read by workers about to park (every slot,
/// once, and the ones that hold a unit for the 3 µs grace): with W
/// workers parking at once the owner's next fill finds its line shared by
/// up to W - 1 readers and pays one invalidation for all of them; the
/// grace bounds how long they read it. The monitor reads each worker's
/// progress word every 10 ms while the pool is busy.
///
/// Locks: the pool's lock (injector, idle list, worker list) is a
/// `GuardLock` (the plain mutex core), never held while running an item;
/// the workers' rings take no lock.
final class WorkerPool: PoolPoller.Workers, @unchecked Sendable {
    // @unchecked: mutable state is guarded by `lock` (injector, idle, workers,
    // threadCount) or is atomic (`words`).

    /// The priority bands. High and default share the standard pool (its
    /// two injector lanes order them); low and background have their own
    /// workers, at nice 10 and 19: an unprivileged thread cannot lower its
    /// nice value back, so a worker cannot change priority per item.
    enum Band: Sendable {
        case standard, low, background

        var niceValue: Int32? {
            switch self {
            case .standard: nil
            case .low: 10
            case .background: 19
            }
        }

        /// Short enough for Linux's 15-byte thread names after "spindle.".
        var threadName: String {
            switch self {
            case .standard: "std"
            case .low: "low"
            case .background: "bg"
            }
        }

        var name: String {
            switch self {
            case .standard: "standard"
            case .low: "low"
            case .background: "background"
            }
        }
    }

    /// Immortal (`makeImmortal`), as the global queues that lead to them.
    static let standard = makeImmortal(WorkerPool(band: .standard))
    static let low = makeImmortal(WorkerPool(band: .low))
    static let background = makeImmortal(WorkerPool(band: .background))

    /// At most this many workers beyond `width`, started while others block.
    /// Large enough that 1,000 items each waiting for a later item complete
    /// (the stress test); Go's limit is 10,000 threads, libdispatch's 512.
    static let compensationLimit = 1024

    /// How long a worker beyond `width` waits for work before it exits
    /// (libdispatch on Linux: 5 s).
    static let idleExit: Duration = .seconds(2)

    /// How long the pool's spinner polls before parking: a few passes over
    /// the rings, as Go's spinning threads make, not a wait for a whole
    /// wake-up. Measured on the 2-vCPU VM (a hand-off through two serial
    /// queues and a semaphore, per round trip): 50 µs (about one wake-up of
    /// an idle vCPU there) made it bimodal, 2.7 or 20–34 µs, because the
    /// spinner holds one vCPU while the thread it answers must be woken on
    /// the other, halted one; 5 µs gave 10–17 µs, none 9.4–11.7 µs. 5 µs
    /// keeps a worker for items that follow at once (serial `async` +
    /// `sync`: 34–54 ns per item, against 45–124 ns without) and burns at
    /// most 5 µs of one core each time the pool runs dry.
    static let spinBeforePark: Duration = .microseconds(5)

    let band: Band
    let width: Int
    let maximumThreads: Int

    // Guarded by `lock`.
    let lock = GuardLock()
    /// The injector's lanes, as two stored constants rather than an array:
    /// a `let` of the pool is used in place, where an array element would
    /// be retained and released on every push and take.
    let highInjector: WorkRing
    let defaultInjector: WorkRing
    /// The injector lanes' published counts, read by polling workers
    /// through raw pointers: reading them through the ring objects would
    /// retain and release the rings, writes to lines the busy workers use.
    let injectorCounts: [UnsafeMutablePointer<Int>]
    var idle: [PoolWorker] = []
    var workers: [PoolWorker] = [] {
        // An atomic increment only: this runs in a child after `fork()` too,
        // where nothing may make type metadata (see `ForkHandlers`).
        didSet { AtomicMemory.increment(workersGeneration, ordering: .releasing) }
    }
    var threadCount = 0

    /// Atomic counters, each on its own cache line: active, searching,
    /// spinner, and the generation of `workers`.
    private let words: UnsafeMutableRawPointer
    var active: UnsafeMutablePointer<Int> { words.assumingMemoryBound(to: Int.self) }
    var searching: UnsafeMutablePointer<Int> { (words + 64).assumingMemoryBound(to: Int.self) }
    /// 1 while a worker spins before parking: at most one per pool does.
    var spinner: UnsafeMutablePointer<Int> { (words + 128).assumingMemoryBound(to: Int.self) }
    /// Bumped by every change of `workers`, so that a spinning worker
    /// rebuilds its list of the rings' counts only when the workers changed
    /// (not an array per spin).
    var workersGeneration: UnsafeMutablePointer<Int> { (words + 192).assumingMemoryBound(to: Int.self) }

    /// Lane numbers of the injector.
    static let highLane = 0
    static let defaultLane = 1

    init(band: Band, width: Int = Topology.availableCPUCount) {
        self.band = band
        self.width = width
        maximumThreads = width + Self.compensationLimit
        highInjector = WorkRing(capacity: 256, publishesCount: true)
        defaultInjector = WorkRing(capacity: 1024, publishesCount: true)
        injectorCounts = [highInjector.publishedCount, defaultInjector.publishedCount]
        words = allocateStableWords(byteCount: 256)
        _ = Self.forkHandlersRegistered
        if band == .standard { poller = makeImmortal(PoolPoller(pool: self)) }
        monitor = makeImmortal(PoolMonitor(pool: self))
    }

    /// The kernel watches of queue-targeted event sources, waited on by an
    /// idle worker (see `PoolPoller`): the standard pool's only. Set in
    /// `init`, never after; immortal, as the pools are (no reference
    /// counting on it from the workers).
    private(set) var poller: PoolPoller?

    /// The watch over workers blocked outside Spindle's waits (see
    /// `PoolMonitor`). Immortal, as the pool.
    private(set) var monitor: PoolMonitor! = nil

    // MARK: Submitting

    /// Queues `unit` to run on one of the pool's workers. Never blocks for
    /// long (a short lock, or none). Orders: everything before the call
    /// happens before the unit runs (the worker ring's sequentially
    /// consistent `tail` store, or the injector's lock).
    func submit(_ unit: consuming WorkUnit, lane: Int, shared: Bool = false) {
        var unit: WorkUnit? = consume unit
        if lane == Self.defaultLane, let worker = PoolWorker.current(in: self) {
            let filledSlot = worker._withUnsafeGuaranteedRef { $0.pushLocal(unit.take().unsafelyUnwrapped, mayUseSlot: !shared) }
            if filledSlot {
                // A parked worker dispatching the poller's events runs the
                // unit itself as soon as it has taken a permit back
                // (`PoolWorker.holdPoller`), a wake-up sooner than anyone
                // woken for it: no announcement.
                guard worker._withUnsafeGuaranteedRef({ !$0.dispatchingWhileParked && $0.slot.announcesFill() })
                else { return }
                // The fill's store before the loads of the wake-up check
                // (see `NextUnitSlot.fill`).
                memoryBarrier()
                if wakeWouldStart { wakeOne(forSlotOf: worker.takeUnretainedValue()) }
                return
            }
        } else {
            lock.lock()
            if lane == Self.highLane {
                highInjector.pushBack(unit.take().unsafelyUnwrapped)
            } else {
                defaultInjector.pushBack(unit.take().unsafelyUnwrapped)
            }
            lock.unlock()
        }
        notifyIfNeeded()
    }

    /// Wakes or starts a worker if work may be waiting, nobody is searching
    /// and a permit is free. The loads are sequentially consistent, pairing
    /// with the parking worker's decrement and re-check (see `PoolWorker.park`).
    @inline(__always)
    func notifyIfNeeded() {
        if wakeWouldStart { wakeOne() }
    }

    /// Whether nobody is searching and a permit is free: a submission must
    /// wake a worker (stale at once; the loads are sequentially consistent,
    /// see `notifyIfNeeded`).
    @inline(__always)
    var wakeWouldStart: Bool {
        AtomicMemory.load(from: searching, ordering: .sequentiallyConsistent) == 0
            && AtomicMemory.load(from: active, ordering: .sequentiallyConsistent) < width
    }

    /// The poller needs a holder (`PoolPoller.Workers`), and a permit is
    /// free: pokes a parked worker (`PoolWorker.pokeForPoller`), which
    /// leaves its futex for the poller and stays parked, with no permit, no
    /// search and no spin; with none parked, starts a worker within the
    /// width. Even while another worker searches: a searcher may find work
    /// and run it instead of parking into the poller, and the holder that
    /// hands the poller on (the eager hand-off, `PoolPoller.release`) is
    /// itself a searcher about to run what it found. With every permit
    /// taken this is one load and no lock (a busy worker's poll at its fair
    /// look ends here).
    @discardableResult
    func wakeForPoller() -> Bool {
        guard AtomicMemory.load(from: active, ordering: .sequentiallyConsistent) < width else { return false }
        lock.lock()
        if let i = lastIdleIndexNotPolling() {
            let worker = idle[i]
            // Idle-listed under the lock: parked, so the poke cannot miss
            // (false only if it was poked already and is on its way).
            let poked = worker.pokeForPoller()
            lock.unlock()
            if poked { worker.wakeAfterPoke() }
            return poked
        }
        // Nobody parked but perhaps a holder: nothing to do; or nobody at
        // all yet: a new worker, which parks into the poller.
        let nobodyIdle = idle.isEmpty
        lock.unlock()
        return nobodyIdle && wakeOne(evenIfSearching: true)
    }

    /// Whether the calling thread is one of this pool's workers
    /// (`PoolPoller.Workers`).
    var isWorkerThread: Bool { PoolWorker.current(in: self) != nil }

    /// The calling worker keeps hand-off `ticket` to be judged when it is
    /// back at the poller (`PoolPoller.Workers`).
    func noteHandOff(_ ticket: Int) {
        PoolWorker.current(in: self)?._withUnsafeGuaranteedRef { $0.keepHandOffTicket(ticket) }
    }

    /// Under the lock, re-checks and hands a permit to an idle worker, or
    /// starts a worker when none is idle. `filler`: the worker whose slot
    /// was just filled, if that is why (see `PoolWorker.wakeHint`).
    /// `evenIfSearching`: wake although a worker is searching (for the
    /// poller, see `wakeForPoller`). Returns whether it woke or started one.
    @discardableResult
    func wakeOne(forSlotOf filler: PoolWorker? = nil, evenIfSearching: Bool = false) -> Bool {
        lock.lock()
        guard evenIfSearching || AtomicMemory.load(from: searching, ordering: .relaxed) == 0,
              AtomicMemory.load(from: active, ordering: .relaxed) < width
        else {
            lock.unlock()
            return false
        }
        let hint = filler.flatMap { filler in filler.slot.fullWord.map { (filler, $0) } }
        if let worker = takeIdleWorker() {
            worker.wakeHint = hint
            AtomicMemory.add(1, to: active, ordering: .sequentiallyConsistent)
            AtomicMemory.add(1, to: searching, ordering: .sequentiallyConsistent)
            let startMonitor = monitor.armIfAsleep()
            lock.unlock()
            worker.unpark()
            if startMonitor { monitor.startThread() }
        } else if threadCount < maximumThreads {
            threadCount += 1
            AtomicMemory.add(1, to: active, ordering: .sequentiallyConsistent)
            AtomicMemory.add(1, to: searching, ordering: .sequentiallyConsistent)
            let worker = PoolWorker(pool: self)
            worker.wakeHint = hint
            workers.append(worker)
            let startMonitor = monitor.armIfAsleep()
            lock.unlock()
            worker.start()
            if startMonitor { monitor.startThread() }
        } else {
            lock.unlock()
            return false
        }
        return true
    }

    /// The index of the idle worker parked last that does not wait in the
    /// poller, under the lock; nil if none. (A plain index loop: this runs
    /// in a child after `fork()` too.)
    private func lastIdleIndexNotPolling() -> Int? {
        var i = idle.count - 1
        while i >= 0 {
            if !idle[i].isPolling { return i }
            i -= 1
        }
        return nil
    }

    /// The idle worker to wake, under the lock: the one parked last, but
    /// not the poller's holder while another is idle (the holder would stop
    /// watching the kernel to run the work). Nil if none is idle.
    /// (Plain index loops: this runs in a child after `fork()` too.)
    private func takeIdleWorker() -> PoolWorker? {
        guard !idle.isEmpty else { return nil }
        if let i = lastIdleIndexNotPolling() { return idle.remove(at: i) }
        return idle.removeLast()
    }

    /// Whether the injector or any of `workers`' rings holds work, and,
    /// with `countingSlots`, their slots (stale at once; for wake-up
    /// decisions). A parking worker counts the slots apart (see
    /// `PoolWorker.stealStaleSlot`).
    func hasQueuedWork(countingSlots: Bool = true, in workers: [PoolWorker]? = nil) -> Bool {
        if injectorHasWork { return true }
        return (workers ?? workerSnapshot()).contains { $0.hasQueuedWork(countingSlot: countingSlots) }
    }

    // MARK: Taking work

    /// Takes a unit from one injector lane. From the default lane it takes
    /// a fair share more (up to `PoolWorker.stealLimit`) into the worker's
    /// ring, so that a burst from outside costs the workers one trip through
    /// the pool's lock per batch rather than per unit (Go's `globrunqget`).
    func takeFromInjector(lane: Int, for worker: PoolWorker) -> WorkUnit? {
        guard AtomicMemory.load(from: injectorCounts[lane], ordering: .sequentiallyConsistent) > 0 else { return nil }
        lock.lock()
        guard let unit = lane == Self.highLane ? highInjector.popFront() : defaultInjector.popFront() else {
            lock.unlock()
            return nil
        }
        var moved = 0
        if lane == Self.defaultLane {
            let share = min(defaultInjector.count / width, PoolWorker.stealLimit)
            if share > 0 { moved = defaultInjector.popFront(into: worker.stealBuffer, limit: share) }
        }
        lock.unlock()
        if moved > 0 { worker.adoptFromBuffer(moved) }
        return unit
    }

    /// Whether either injector lane holds work (stale at once).
    @inline(__always)
    var injectorHasWork: Bool {
        AtomicMemory.load(from: injectorCounts[0], ordering: .sequentiallyConsistent) > 0
            || AtomicMemory.load(from: injectorCounts[1], ordering: .sequentiallyConsistent) > 0
    }

    /// A snapshot of the live workers, for stealing.
    func workerSnapshot() -> [PoolWorker] {
        lock.lock()
        defer { lock.unlock() }
        return workers
    }

    // MARK: Diagnostics (tests)

    /// Worker threads alive now (parked ones included).
    package var threadCountNow: Int {
        lock.lock()
        defer { lock.unlock() }
        return threadCount
    }

    /// Workers holding a permit now.
    package var activeCount: Int { AtomicMemory.load(from: active, ordering: .relaxed) }

    /// The global queue whose items arrive in `lane`.
    func globalQueue(lane: Int) -> WorkQueue {
        switch band {
        case .standard: WorkQueue.global(lane == Self.highLane ? .high : .default)
        case .low: WorkQueue.global(.low)
        case .background: WorkQueue.global(.background)
        }
    }

    // MARK: Fork

    /// The queues' fork handlers (`ForkHandlers`), registered with the first
    /// pool or delayed item. In the parent: make every pool, the main queue
    /// and the timer heap now, and run on nothing the code
    /// the child runs, so that the child makes no lazy global and no type
    /// metadata. In the child: the pools start again without their workers,
    /// the main queue is repaired, and what the forking thread holds of the
    /// queues whose items it runs is noted for the child's epoch.
    static let forkHandlersRegistered: Void = {
        ForkHandlers.register(
            .queues,
            prepare: {
                _ = WorkerPool.standard
                _ = WorkerPool.low
                _ = WorkerPool.background
                _ = WorkQueue.main
                _ = TimerQueue.shared
                WorkerPool.prepareForFork()
                // The walk the child makes, made here first (epoch 0
                // records nothing).
                QueueFrame.noteHoldingsAfterFork(epoch: 0)
            },
            child: { epoch in
                WorkerPool.childAfterForkAll()
                WorkQueue.main.childAfterFork()
                QueueFrame.noteHoldingsAfterFork(epoch: epoch)
                // The timer heap keeps the delayed submissions (their queues
                // go on in the child) and announces them to the child's
                // poller, reset by `childAfterForkAll` above.
                TimerQueue.shared.childAfterFork()
                TimerQueue.shared.announceAfterFork()
            })
    }()

    /// Every pool, in a child after `fork()`.
    static func childAfterForkAll() {
        // One by one, not through an array literal: the child must not
        // allocate type metadata (see `ForkHandlers`), and the three pools
        // exist already (the queues' prepare handler made them in the
        // parent, see `forkHandlersRegistered`).
        standard.childAfterFork()
        low.childAfterFork()
        background.childAfterFork()
    }

    /// In the parent, just before `fork()`: runs, on nothing, the generic
    /// code `childAfterFork` runs. A build without specialization (debug)
    /// makes the type metadata of that code on its first run, under the
    /// Swift runtime's locks; a child forked while another parent thread
    /// held one of them would wait forever (seen: a debug child hung in the
    /// `for` over the workers, in a conformance lookup). Made here, the
    /// metadata is cached before the fork.
    static func prepareForFork() {
        let nobody: PoolWorker? = nil
        let none: [PoolWorker] = nobody.map { [$0] } ?? []
        for worker in none where worker !== nobody { _ = worker }
        _ = nobody.flatMap { $0.pool === standard ? $0 : nil }
        // What a child's new workers, its monitor and its poller run before
        // anything else (see `ForkHandlers.makeMetadata`).
        PoolWorker.prepareForFork()
        PoolPoller.prepareForFork()
        TimerQueue.prepareForFork()
        // What they run when they drain queues.
        WorkQueue.prepareForFork()
    }

    /// In a child after `fork()`: the workers are gone (only the forking
    /// thread exists), so the pool starts again with none; queued work stays
    /// queued (the local rings' contents move to the injector) and runs on
    /// the child's first new workers. Locks a parent thread held are
    /// replaced, not waited for.
    func childAfterFork() {
        lock.reinitializeAfterFork()
        // The forking thread may be one of this pool's workers, in the middle
        // of an item: it goes on as the child's only worker.
        let survivor = PoolWorker.current.flatMap { $0.pool === self ? $0 : nil }
        for worker in workers {
            worker.ring.reclaimAfterFork()
            worker.slot.reclaimAfterFork()
            if worker !== survivor { worker.moveQueuedWork(to: defaultInjector) }
        }
        workers = survivor.map { [$0] } ?? []
        idle = []
        threadCount = workers.count
        poller?.childAfterFork()
        monitor.childAfterFork()
        AtomicMemory.store(workers.count, to: active, ordering: .relaxed)
        AtomicMemory.store(0, to: searching, ordering: .relaxed)
        if !highInjector.isEmpty || !defaultInjector.isEmpty { notifyIfNeeded() }
    }
}
