import CShims

/// One thread of a `WorkerPool`: its local ring, its park word, and the loop
/// that finds and runs work. Installed as its thread's `BlockingObserver`, so
/// a blocking wait inside an item gives the worker's permit back to the pool.
final class PoolWorker: BlockingObserver, @unchecked Sendable {
    // @unchecked: `ring` synchronizes itself (see `StealableRing`); the
    // fair looks' counters, `isSearching` and `stealBuffer` are touched
    // only by the worker's own thread; `slot` synchronizes itself (see
    // `NextUnitSlot`); the park word is atomic.

    /// The worker's pool, unretained (the pools live for the whole
    /// process). The per-unit paths reach it through `withPool`, which costs
    /// no reference counting: every worker shares the pool object, and an
    /// `unowned(unsafe)` field is still retained and released around each
    /// use, moving the count's cache line between workers on every unit.
    let poolRef: Unmanaged<WorkerPool>
    /// `poolRef`, retained at each use; for the paths that are not per unit.
    var pool: WorkerPool { poolRef.takeUnretainedValue() }

    /// Runs `body` with the pool at +0 (no retain, no release).
    @inline(__always)
    func withPool<R>(_ body: (WorkerPool) -> R) -> R { poolRef._withUnsafeGuaranteedRef(body) }
    /// The worker's own units: it pushes and pops without a lock, others
    /// steal the older half.
    let ring = StealableRing()
    /// 0 running, 1 parked, 2 parked and asked to look at the pool's
    /// poller (`pokeForPoller`). The futex word.
    private let parkWord: UnsafeMutablePointer<UInt32>
    /// What the worker is doing, for the pool's monitor (see `Progress`):
    /// written by the worker alone, relaxed, read by the monitor.
    private let progressWord: UnsafeMutablePointer<UInt64>
    /// The worker thread's kernel id (0 until it runs), for the monitor's
    /// look at its scheduler state.
    private let threadIDWord: UnsafeMutablePointer<Int32>
    /// Units this worker has started. Owner only.
    private var unitsStarted: UInt64 = 0
    /// `progress` at the monitor's last look. The monitor's thread only.
    var monitorLastLook: UInt64 = 0
    /// The slot's word at the monitor's last look (0: empty). The
    /// monitor's thread only.
    var monitorLastSlot: UInt64 = 0
    /// 1 while the worker, parked, waits in the pool's poller rather than
    /// on `parkWord`: `unpark` then wakes the poller. Written by the worker,
    /// read by wakers; beside `parkWord`, which the same threads touch.
    private let pollingWord: UnsafeMutablePointer<UInt32>
    /// True while the worker runs event handlers' merges without a permit
    /// (parked, holding the poller): a blocking wait announced meanwhile
    /// gives back no permit. Owner thread only (the pool's submission path
    /// reads it on this worker's own thread).
    private(set) var dispatchingWhileParked = false
    /// The ticket of this worker's last hand-off of the poller, until it
    /// comes back (`returnFromHandOff`); 0 for none. Owner only.
    private var handOffTicket = 0
    /// Whether `willBlock` gave a permit back, for `didUnblock`. Owner only.
    private var gaveUpPermit = false
    /// Looks since the last fair look (the poller, then the injector,
    /// before the slot). Owner only.
    private var looksSinceFair = 0
    /// Looks between two fair looks: Tokio's global queue interval, tuned
    /// after each so that they come about every `fairPeriod` of running
    /// units (`tuneFairInterval`): every 61st look for units of up to
    /// 3.3 µs (Go's and Tokio's fixed 61), every 2nd for units of 100 µs
    /// and more. Owner only.
    private var fairInterval = PoolWorker.maxFairInterval
    /// The clock and `unitsStarted` at the last fair look; the clock is 0
    /// after a park (the time asleep is no unit's). Owner only.
    private var fairLookClock: Int64 = 0
    private var fairLookUnits: UInt64 = 0
    /// The average time of a unit, in nanoseconds, weighted towards recent
    /// ones (0 until measured). Owner only.
    private var unitTime: Double = 0
    /// Tokio's target (`TARGET_GLOBAL_QUEUE_INTERVAL`): a worker running
    /// long units still looks at the poller and the injector about this
    /// often.
    static let fairPeriodNanoseconds: Double = 200_000
    static let minFairInterval = 2
    static let maxFairInterval = 61
    private var isSearching = true
    static let stealLimit = 64
    /// Scratch space for units moved between rings (steals, injector
    /// batches). Owner thread only.
    let stealBuffer: UnsafeMutablePointer<WorkUnit>
    /// The next unit this worker runs: one its own item submitted while its
    /// ring was empty (see `NextUnitSlot`). Whatever is submitted after it
    /// goes to the ring, so the slot always holds the oldest and the order
    /// stays FIFO. A fill is announced like a ring push (a parked worker is
    /// woken if nobody searches; backing off while those wake-ups find
    /// nothing, see `NextUnitSlot`), and a worker about to park takes a unit
    /// that has sat there for `slotGrace` (`stealStaleSlot`): the owner
    /// runs a chain of short items without losing one to a thief, and an
    /// item that keeps computing after it submitted leaves its successor
    /// to a free worker. Flushed to the ring when the worker blocks or
    /// parks, and after `slotLimit` slot runs in a row.
    let slot = NextUnitSlot()
    /// The workers' ring counts as of `pollGeneration` of the pool's worker
    /// list, for the spin before parking: rebuilt only when the list
    /// changed, so a spin allocates nothing. Owner thread only.
    private var pollCounts: [UnsafeMutableRawPointer] = []
    private var pollGeneration = -1
    private var slotRuns = 0
    private static let slotLimit = 16
    /// How long a unit sits in another worker's slot before a worker about
    /// to park takes it: Go's back-off before it steals `runnext` from a
    /// running P (`runqgrab`'s `usleep(3)`). Long against a chain's step
    /// (its owner takes the unit back within a few hundred nanoseconds of
    /// the item returning), short against the wake-up that brought the
    /// thief (40-55 µs on an idle vCPU here, a few µs on bare metal).
    static let slotGrace: Duration = .microseconds(3)
    /// State of the xorshift generator that picks the first victim of a
    /// steal. `Int.random` would read the system generator, a `getrandom`
    /// system call per steal attempt (measured: one per event-source
    /// handler call). Owner thread only; never 0.
    private var stealSeed: UInt64

    init(pool: WorkerPool) {
        poolRef = Unmanaged.passUnretained(pool)
        let words = allocateStableWords(byteCount: 24)
        parkWord = words.assumingMemoryBound(to: UInt32.self)
        pollingWord = (words + 4).assumingMemoryBound(to: UInt32.self)
        progressWord = (words + 8).assumingMemoryBound(to: UInt64.self)
        threadIDWord = (words + 16).assumingMemoryBound(to: Int32.self)
        stealBuffer = .allocate(capacity: Self.stealLimit)
        stealSeed = UInt64(UInt(bitPattern: parkWord)) | 1
    }

    /// The next first victim of a steal among `count` workers (xorshift64).
    private func nextVictim(_ count: Int) -> Int {
        stealSeed ^= stealSeed << 13
        stealSeed ^= stealSeed >> 7
        stealSeed ^= stealSeed << 17
        return Int(stealSeed % UInt64(count))
    }

    deinit {
        deallocateStableWords(UnsafeMutableRawPointer(parkWord))
        stealBuffer.deallocate()
    }

    /// The pool worker running on the calling thread, or nil (also nil inside
    /// a blocking region, where the observer is off the thread).
    @inline(__always)
    static var current: PoolWorker? {
        guard let raw = cshims_blocking_observer() else { return nil }
        // Only pool workers install observers.
        return unsafeDowncast(Unmanaged<BlockingObserver>.fromOpaque(raw).takeUnretainedValue(), to: PoolWorker.self)
    }

    /// The calling thread's worker, if it is one of `pool`'s, unretained:
    /// for the per-unit path of a submit (`current` retains and releases).
    @inline(__always)
    static func current(in pool: WorkerPool) -> Unmanaged<PoolWorker>? {
        guard let raw = cshims_blocking_observer() else { return nil }
        // Only pool workers install observers.
        let worker = Unmanaged<PoolWorker>.fromOpaque(raw)
        let itsPool = worker._withUnsafeGuaranteedRef { $0.poolRef.toOpaque() }
        return itsPool == Unmanaged.passUnretained(pool).toOpaque() ? worker : nil
    }

    /// The progress word: units started, shifted left by two, and the
    /// state in the low two bits. The count tells the monitor whether the
    /// worker ran another unit since its last look.
    enum Progress {
        case idle, running, inSpindleWait

        static func state(of word: UInt64) -> Progress {
            switch word & 3 {
            case 1: .running
            case 2: .inSpindleWait
            default: .idle
            }
        }

        static func word(units: UInt64, _ state: Progress) -> UInt64 {
            units << 2 | (state == .running ? 1 : state == .inSpindleWait ? 2 : 0)
        }
    }

    /// The progress word now (stale at once; the monitor's read).
    var progress: UInt64 { AtomicMemory.load(from: progressWord, ordering: .relaxed) }

    /// Whether the kernel reports the worker's thread asleep (anything but
    /// running or runnable): a wait the pool was not told of, when the
    /// worker is running a unit outside Spindle's waits.
    var isAsleepInKernel: Bool {
        let tid = AtomicMemory.load(from: threadIDWord, ordering: .relaxed)
        guard tid > 0 else { return false }
        let state = cshims_thread_state(tid)
        return state > 0 && state != Int32(UInt8(ascii: "R"))
    }

    func start() {
        var attributes = NativeThread.Attributes()
        attributes.name = "spindle.\(pool.band.threadName)"
        do {
            try NativeThread.detach(attributes) { [self] in self.main() }
        } catch {
            // The machine refused a thread (RLIMIT_NPROC, memory). Give the
            // permit back; queued work waits for the workers there are.
            pool.lock.lock()
            pool.threadCount -= 1
            pool.workers.removeAll { $0 === self }
            pool.lock.unlock()
            AtomicMemory.add(-1, to: pool.searching, ordering: .sequentiallyConsistent)
            AtomicMemory.add(-1, to: pool.active, ordering: .sequentiallyConsistent)
            if pool.threadCountNow == 0 {
                misuse("WorkerPool: cannot start any worker thread for the \(pool.band.name) pool: \(error)")
            }
        }
    }

    /// In the parent, before `fork()`: the generic types and conformances
    /// of the worker's loop, the pool's and the monitor's
    /// (`ForkHandlers.makeMetadata`, `makeConformance`).
    static func prepareForFork() {
        ForkHandlers.makeMetadata(
            PoolPoller?.self, PoolWorker?.self, WorkUnit?.self, UInt64?.self, UnsafeMutableRawPointer?.self,
            [PoolWorker].self, IndexingIterator<[PoolWorker]>.self,
            (PoolWorker, UInt64).self, [(PoolWorker, UInt64)].self, IndexingIterator<[(PoolWorker, UInt64)]>.self,
            [UnsafeMutableRawPointer].self, IndexingIterator<[UnsafeMutableRawPointer]>.self,
            UnsafeMutablePointer<Int>.self, Unmanaged<WorkQueue>.self)
        ForkHandlers.makeConformance(sequence: [PoolWorker].self)
        ForkHandlers.makeConformance(collection: [PoolWorker].self)
        ForkHandlers.makeConformance(bidirectional: [PoolWorker].self)
        ForkHandlers.makeConformance(mutable: [PoolWorker].self)
        ForkHandlers.makeConformance(rangeReplaceable: [PoolWorker].self)
        ForkHandlers.makeConformance(sequence: [(PoolWorker, UInt64)].self)
        ForkHandlers.makeConformance(collection: [(PoolWorker, UInt64)].self)
        ForkHandlers.makeConformance(sequence: [UnsafeMutableRawPointer].self)
        ForkHandlers.makeConformance(collection: [UnsafeMutableRawPointer].self)
        ForkHandlers.makeConformance(binaryInteger: Int.self)
        ForkHandlers.makeConformance(binaryInteger: Int64.self)
        ForkHandlers.makeConformance(binaryInteger: UInt64.self)
        ForkHandlers.makeConformance(atomicWord: Int.self)
        ForkHandlers.makeConformance(atomicWord: Int32.self)
        ForkHandlers.makeConformance(atomicWord: UInt32.self)
        ForkHandlers.makeConformance(atomicWord: UInt64.self)
        ForkHandlers.makeConformance(equatable: Progress.self)
        ForkHandlers.makeConformance(hashable: Progress.self)
        ForkHandlers.makeConformance(equatable: PollerOutcome.self)
        ForkHandlers.makeConformance(hashable: PollerOutcome.self)
        ForkHandlers.makeConformance(equatable: WorkerPool.Band.self)
        ForkHandlers.makeConformance(hashable: WorkerPool.Band.self)
        ForkHandlers.makeConformance(comparable: MonotonicClock.Instant.self)
        ForkHandlers.makeConformance(equatable: Futex.WaitResult.self)
        ForkHandlers.makeConformance(equatable: DescriptorWatchError.self)
        ForkHandlers.makeConformance(error: DescriptorWatchError.self)
        ForkHandlers.makeConformance(described: NativeThreadError.self)
    }

    // MARK: The worker's loop

    private func main() {
        if let nice = pool.band.niceValue {
            // Lowering is always allowed; a failure (a seccomp profile) leaves
            // the worker at the process's priority.
            try? NativeThread.current.setPriority(.relative(NativeThread.Priority.relative(forNice: nice)))
        }
        // A worker that holds the pool's poller sleeps until the next timer
        // of a queue source: its timed sleeps end on time, as a loop
        // thread's do (Linux would let each run up to 50 µs late, the
        // default timer slack; measured 30–45 µs late here with it).
        _ = cshims_set_timer_slack(1)
        BlockingObserver.install(self)
        defer { BlockingObserver.install(nil) }
        AtomicMemory.store(cshims_gettid(), to: threadIDWord, ordering: .relaxed)
        takeWakeHint()
        // The global queues of the two lanes, unretained (they live for the
        // whole process): a frame per unit then costs no reference counting
        // on an object every worker shares.
        let laneQueues = [
            Unmanaged.passUnretained(pool.globalQueue(lane: 0)),
            Unmanaged.passUnretained(pool.globalQueue(lane: 1)),
        ]
        let active = pool.active
        let width = pool.width
        while true {
            if let (unit, lane) = findWork() {
                if isSearching { stopSearching() }
                // Relaxed: hints for the monitor, on the worker's own line.
                unitsStarted &+= 1
                AtomicMemory.store(Progress.word(units: unitsStarted, .running), to: progressWord, ordering: .relaxed)
                Perturbation.point(.workerPick)
                QueueFrame.with(unretained: laneQueues[lane]) { unit.run() }
                AtomicMemory.store(Progress.word(units: unitsStarted, .idle), to: progressWord, ordering: .relaxed)
                // Over width: a worker came back from a blocking wait while
                // its replacement ran. Give the permit back.
                if AtomicMemory.load(from: active, ordering: .relaxed) > width {
                    if !park() { return }
                }
                continue
            }
            if !isSearching {
                isSearching = true
                AtomicMemory.add(1, to: pool.searching, ordering: .sequentiallyConsistent)
            }
            // Ready events first: a worker that would spin and then wait in
            // the poller takes what the kernel has for it now.
            if pollWithoutBlocking() { continue }
            if spinForWork() { continue }
            if !park() { return }
        }
    }

    /// A searcher found work. If it was the last searcher and more work is
    /// queued, another worker starts searching (the burst spreads).
    private func stopSearching() {
        isSearching = false
        let left = AtomicMemory.add(-1, to: pool.searching, ordering: .sequentiallyConsistent)
        if left == 0 && pool.hasQueuedWork() { pool.notifyIfNeeded() }
    }

    /// Local ring, injector lanes and stealing, in the order described on
    /// `WorkerPool`.
    private func findWork() -> (WorkUnit, lane: Int)? {
        let defaultLane = WorkerPool.defaultLane
        looksSinceFair &+= 1
        // Under schedule perturbation, now and then the slot's unit goes to
        // the front of the ring, where a thief may take it (as after
        // `slotLimit` runs), and a steal comes before the own ring: orders
        // the pool never promised (Go's scheduler under -race declines
        // `runnext` at random the same way).
        if slot.isFullForOwner && Perturbation.choose(.workerPick) { flushSlot() }
        // Every `fairInterval`th look, whatever the slot holds (Go's
        // `schedtick % 61`, Tokio's tuned global queue interval; both
        // before `runnext`): the poller, then the injector. Checked after
        // the slot instead, a unit chaining itself through the slot skipped
        // it for as long as the chain ran (the fall-through every
        // `slotLimit + 1` looks met a multiple of 61 once per 1,037 looks):
        // a 1 ms `async(after:)` behind two chains of 100 µs items ran
        // about 100 ms late. With a fixed 61 it ran about 2 ms late (61
        // items of 100 µs between two looks of a worker); tuned, a look
        // comes every 2 such items.
        if looksSinceFair >= fairInterval {
            looksSinceFair = 0
            tuneFairInterval()
            _ = pollWithoutBlocking()
            if let unit = takeFromInjector(lane: defaultLane) { return (unit, defaultLane) }
        }
        if slot.isFullForOwner {
            // After `slotLimit` slot runs in a row the slot's unit moves to
            // the ring, if anything else waits (its own ring or the
            // injector) that another worker could take meanwhile; with
            // nothing else queued there is nobody to be fair to, and a
            // flush would only wake a worker to steal the chain.
            if slotRuns >= Self.slotLimit && (!ring.isEmptyForOwner || withPool { $0.injectorHasWork }) {
                flushSlot()
            } else if let unit = slot.take() {
                slotRuns += 1
                return (unit, defaultLane)
            }
        }
        slotRuns = 0
        if let unit = takeFromInjector(lane: WorkerPool.highLane) { return (unit, WorkerPool.highLane) }
        if Perturbation.choose(.workerPick), let unit = steal() { return (unit, defaultLane) }
        if let unit = ring.pop() { return (unit, defaultLane) }
        if let unit = takeFromInjector(lane: defaultLane) { return (unit, defaultLane) }
        if let unit = steal() { return (unit, defaultLane) }
        return nil
    }

    /// At a fair look: from the units run since the last one and the time
    /// they took, the average unit time (Tokio's per-unit moving average,
    /// weight 0.1 per unit), and from it the looks until the next fair look:
    /// `fairPeriodNanoseconds` over the unit time, within 2...61. One clock
    /// read per fair look: for units of a few hundred nanoseconds, one per
    /// 61 units. Owner only.
    private func tuneFairInterval() {
        let now = MonotonicClock.now.nanoseconds
        let units = unitsStarted &- fairLookUnits
        if fairLookClock != 0 && units > 0 {
            let mean = Double(now &- fairLookClock) / Double(units)
            // The weight of `units` samples of weight 0.1 each, 1 - 0.9^units;
            // taken as 1 from 30 units on (0.9^30 is about 0.04).
            let weight = units >= 30 ? 1 : 1 - Self.decay(units)
            unitTime = unitTime == 0 ? mean : unitTime + weight * (mean - unitTime)
            let looks = Self.fairPeriodNanoseconds / max(unitTime, 1)
            fairInterval = looks >= Double(Self.maxFairInterval)
                ? Self.maxFairInterval : max(Self.minFairInterval, Int(looks))
        }
        fairLookClock = now
        fairLookUnits = unitsStarted
    }

    /// 0.9 to the power `units` (below 30). A `while`, not a `for` over a
    /// range: no generic type a forked child would have to make (see
    /// `scripts/check-fork-metadata`).
    private static func decay(_ units: UInt64) -> Double {
        var result = 1.0
        var left = units
        while left > 0 {
            result *= 0.9
            left -= 1
        }
        return result
    }

    /// Takes the pool's poller if something is watched and nobody holds it,
    /// and runs what is ready or due, without waiting; their calls land in
    /// this worker's slot and ring. At each fair look (`fairInterval`,
    /// Tokio's `event_interval`), so that event sources are served while every
    /// worker is busy, and when the worker runs out of work, before it
    /// spins. Returns whether it ran anything.
    private func pollWithoutBlocking() -> Bool {
        guard let poller = withPool({ $0.poller }), poller.isWatching else { return false }
        returnFromHandOff(poller)
        guard poller.tryHold() else { return false }
        let ran = poller.waitAndDispatch(block: false)
        // What it found waited with nobody at the poller: hand-offs are
        // eager again (see `PoolPoller.release`).
        if ran { poller.resetHandOffBackoff() }
        handOffTicket = poller.release(ranNothing: !ran)
        return ran
    }

    /// A hand-off this worker made from inside a unit
    /// (`PoolPoller.needsHolder`): judged when it is back at the poller,
    /// as its own `release`'s are. The newest ticket replaces an older one,
    /// which is no longer the pending hand-off. Owner thread only.
    func keepHandOffTicket(_ ticket: Int) {
        handOffTicket = ticket
    }

    /// Back at the poller (a look, or parking) after handing it off: tells
    /// it, so that a hand-off whose new holder ran nothing meanwhile counts
    /// as wasted (`PoolPoller.leaverReturned`).
    @inline(__always)
    private func returnFromHandOff(_ poller: PoolPoller) {
        guard handOffTicket != 0 else { return }
        poller.leaverReturned(handOffTicket)
        handOffTicket = 0
    }

    @inline(__always)
    private func takeFromInjector(lane: Int) -> WorkUnit? {
        withPool { $0.takeFromInjector(lane: lane, for: self) }
    }

    /// Takes half of another worker's ring (at most `stealLimit` units):
    /// runs the first, keeps the rest in its own ring.
    private func steal() -> WorkUnit? {
        let all = pool.workerSnapshot()
        guard all.count > 1 else { return nil }
        let start = nextVictim(all.count)
        for i in 0..<all.count {
            let victim = all[(start + i) % all.count]
            if victim === self { continue }
            let n = victim.ring.steal(into: stealBuffer, limit: Self.stealLimit)
            if n == 0 { continue }
            let first = stealBuffer.move()
            ring.push(movingFrom: stealBuffer + 1, count: n - 1)
            return first
        }
        return nil
    }

    /// Whether units are queued in this worker's ring, or with
    /// `countingSlot` in its slot (stale at once; sequentially consistent
    /// loads, for the pool's wake-up checks).
    func hasQueuedWork(countingSlot: Bool) -> Bool { ring.count > 0 || (countingSlot && slot.fullWord != nil) }

    /// Pushes a unit submitted from this worker: into its slot if the ring
    /// is empty and `mayUseSlot`, else onto its ring. Either way the caller
    /// announces it (`WorkerPool.submit`). Returns whether it went to the
    /// slot.
    @inline(__always)
    func pushLocal(_ unit: consuming WorkUnit, mayUseSlot: Bool) -> Bool {
        // Only this thread adds to its ring, so an empty one cannot fill
        // meanwhile.
        if mayUseSlot && ring.isEmptyForOwner && !Perturbation.choose(.queueSubmit) {
            guard let refused = slot.fill(unit) else { return true }
            ring.push(refused)
            return false
        }
        ring.push(unit)
        return false
    }

    /// Why a waker woke this worker, if it was a slot fill: the filler and
    /// the slot's word after the fill. Written by the waker under the
    /// pool's lock before it hands the permit over (`unpark`, or the
    /// thread's start), read and cleared by this worker once awake
    /// (`takeWakeHint`), before it next parks (under the same lock).
    var wakeHint: (PoolWorker, UInt64)?

    /// Woken for a slot fill: if the filler's slot still holds that unit,
    /// its owner is still running the item that submitted it, a whole
    /// wake-up later; the unit is taken at once, into this worker's ring.
    /// The wake-up is the grace (`slotGrace` is Go's 3 µs; a futex wake-up
    /// takes longer everywhere), so a chain step that returns within it
    /// keeps its unit, and an item that computes loses it to this worker.
    private func takeWakeHint() {
        guard let (filler, word) = wakeHint else { return }
        wakeHint = nil
        let unit = filler.slot.steal(ifStill: word)
        filler.slot.noteWakeUp(foundWork: unit != nil)
        if let unit { ring.push(unit) }
    }

    /// Moves the slot's unit to the front of the ring, where others can
    /// steal it, and tells them. If a steal in progress holds the ring's
    /// front for long (its thief preempted), the unit goes to the pool's
    /// injector instead: it may then start after units this worker
    /// submitted later, as any unit a thief takes may.
    private func flushSlot() {
        guard let unit = slot.take() else { return }
        if let refused = ring.pushFront(unit) {
            let pool = self.pool
            pool.lock.lock()
            pool.defaultInjector.pushBack(refused)
            pool.lock.unlock()
        }
        pool.notifyIfNeeded()
    }

    /// Moves up to `count` units into the ring (an injector batch).
    func adoptFromBuffer(_ count: Int) {
        ring.push(movingFrom: stealBuffer, count: count)
    }

    /// Moves everything queued here to the pool's default injector, in
    /// order. The caller holds the pool's lock. Owner only (or the child
    /// after `fork()`, where the owner is gone).
    func moveQueuedWork(to injector: WorkRing) {
        if let unit = slot.take() { injector.pushBack(unit) }
        while let unit = ring.pop() { injector.pushBack(unit) }
    }

    /// The pool's one spinner (whoever takes the spinner word) polls the
    /// rings' counts for up to `spinBeforePark`; true if work appeared.
    /// Others return at once.
    private func spinForWork() -> Bool {
        guard AtomicMemory.load(from: pool.spinner, ordering: .relaxed) == 0,
              AtomicMemory.compareAndSwap(expected: 0, desired: 1, at: pool.spinner, ordering: .relaxed)
        else { return false }
        defer { AtomicMemory.store(0, to: pool.spinner, ordering: .relaxed) }
        let deadline = MonotonicClock.now.advanced(by: WorkerPool.spinBeforePark)
        // One snapshot for the whole spin: the pool's lock stays free for
        // submitters. Only loads, so the rings' lines stay shared.
        // Raw pointers to the counts: no reference counting while polling.
        // (Its own ring cannot fill meanwhile: only its own thread pushes.)
        let generation = AtomicMemory.load(from: pool.workersGeneration, ordering: .acquiring)
        if generation != pollGeneration {
            pollCounts = pool.workerSnapshot().map(\.ring.indexWords)
            pollGeneration = generation
        }
        let others = pollCounts
        let high = pool.injectorCounts[WorkerPool.highLane]
        let normal = pool.injectorCounts[WorkerPool.defaultLane]
        // A poll every 16 pause hints (about 0.4 µs here): the counts'
        // lines are written by every submission, and a poller that reads
        // them back to back takes each line away from the submitter.
        while true {
            for _ in 0..<8 {
                if AtomicMemory.load(from: high, ordering: .relaxed) > 0
                    || AtomicMemory.load(from: normal, ordering: .relaxed) > 0
                {
                    return true
                }
                for _ in 0..<16 { spinLoopHint() }
            }
            if others.contains(where: { StealableRing.queuedCount(words: $0, ordering: .relaxed) > 0 }) { return true }
            if MonotonicClock.now >= deadline { return false }
        }
    }

    /// Gives the permit back and sleeps until handed one again. Returns false
    /// if the worker should exit (it was beyond `width` and idle for
    /// `idleExit`).
    private func park() -> Bool {
        let pool = self.pool
        flushSlot()
        fairLookClock = 0
        AtomicMemory.store(1, to: parkWord, ordering: .relaxed)
        pool.lock.lock()
        pool.idle.append(self)
        if isSearching {
            isSearching = false
            AtomicMemory.add(-1, to: pool.searching, ordering: .sequentiallyConsistent)
        }
        AtomicMemory.add(-1, to: pool.active, ordering: .sequentiallyConsistent)
        // Only a worker beyond the width sleeps with the idle-exit deadline.
        // One within it sleeps until woken, so that an idle pool makes no
        // wake-ups at all; a worker started beyond the width later parks
        // with a deadline of its own and retires then (the count is the
        // live threads, so whoever is beyond it when its deadline comes
        // leaves, and the rest stay).
        let spare = pool.threadCount > pool.width
        pool.lock.unlock()
        // The other half of the submitter's push-then-check: work pushed
        // before our decrement became visible is seen here.
        let others = pool.workerSnapshot()
        if pool.hasQueuedWork(countingSlots: false, in: others) && reclaimPermit() { return true }
        if stealStaleSlot(others) && reclaimPermit() { return true }
        let futex = Futex(parkWord)
        var deadline: MonotonicClock.Instant? = spare ? MonotonicClock.now.advanced(by: WorkerPool.idleExit) : nil
        if let poller = pool.poller { returnFromHandOff(poller) }
        while true {
            let word = AtomicMemory.load(from: parkWord, ordering: .acquiring)
            if word == 0 { break }
            // Poked (`pokeForPoller`): back to plainly parked before looking
            // at the poller, so that a poke after the look ends the next
            // futex wait at once rather than being lost. A compare-and-swap:
            // a waker's 0 must stay.
            if word == 2 {
                _ = AtomicMemory.compareAndSwap(expected: 2, desired: 1, at: parkWord, ordering: .relaxed)
            }
            var timedOut = false
            // Wait in the pool's poller if anything is watched and nobody
            // else waits there (a spare worker too, until its deadline).
            if let poller = pool.poller, poller.isWatching, poller.tryHold() {
                let outcome = holdPoller(poller, until: deadline)
                // Leaving to run what it found: the (eager) hand-off.
                handOffTicket = poller.release(handingOff: outcome == .running)
                if outcome == .running { break }
                if outcome == .parkOn { continue }
                timedOut = true
            } else {
                timedOut = futex.wait(expecting: 1, until: deadline) == .timedOut
            }
            if timedOut {
                if retireIfSpare() {
                    // Whatever it leaves (queued work, the poller) goes to
                    // a worker that stays.
                    if pool.hasQueuedWork() || pool.poller?.wantsHolder == true {
                        pool.notifyIfNeeded()
                    }
                    return false
                }
                // Others retired first: the pool is at its width again.
                deadline = nil
            }
        }
        // Woken by `WorkerPool.wakeOne`, which counted us active and searching.
        isSearching = true
        takeWakeHint()
        return true
    }

    private enum PollerOutcome {
        /// The worker holds a permit again: a waker counted it, or it took one
        /// to run what the events queued here.
        case running
        /// Park on: the pool is full (what it queued is left for the busy
        /// workers to steal), or nothing is watched any more.
        case parkOn
        /// `deadline` (a spare worker's idle exit) passed with nothing to do.
        case timedOut
    }

    /// Parked, holding the pool's poller: waits there until woken, until the
    /// events it handled queued work on this worker, or until `deadline`.
    private func holdPoller(_ poller: PoolPoller, until deadline: MonotonicClock.Instant?) -> PollerOutcome {
        while true {
            // A Dekker pair with `unpark`: it clears the park word and then
            // reads this one; here it is the other way round.
            AtomicMemory.store(1, to: pollingWord, ordering: .sequentiallyConsistent)
            if AtomicMemory.load(from: parkWord, ordering: .sequentiallyConsistent) == 0 {
                AtomicMemory.store(0, to: pollingWord, ordering: .relaxed)
                return .running
            }
            dispatchingWhileParked = true
            let ran = poller.waitAndDispatch(block: true, notAfter: deadline)
            dispatchingWhileParked = false
            if ran { poller.holderDispatched() }
            AtomicMemory.store(0, to: pollingWord, ordering: .sequentiallyConsistent)
            if AtomicMemory.load(from: parkWord, ordering: .acquiring) == 0 { return .running }
            if ran && (slot.isFullForOwner || !ring.isEmptyForOwner) {
                if reclaimPermit() { return .running }
                flushSlot()
                return .parkOn
            }
            if let deadline, MonotonicClock.now >= deadline { return .timedOut }
            if !poller.isWatching { return .parkOn }
        }
    }

    /// Takes itself off the idle list with a permit, if nobody has yet.
    private func reclaimPermit() -> Bool {
        pool.lock.lock()
        guard let i = pool.idle.firstIndex(where: { $0 === self }) else {
            pool.lock.unlock()
            return false  // someone is waking us: the wake-up is on its way
        }
        if AtomicMemory.load(from: pool.active, ordering: .relaxed) >= pool.width {
            pool.lock.unlock()
            return false  // another worker has the permit; it will find the work
        }
        pool.idle.remove(at: i)
        AtomicMemory.add(1, to: pool.active, ordering: .sequentiallyConsistent)
        AtomicMemory.add(1, to: pool.searching, ordering: .sequentiallyConsistent)
        AtomicMemory.store(0, to: parkWord, ordering: .relaxed)
        // A worker runs: the monitor watches it (and the poller it left),
        // as after any wake-up with a permit (`WorkerPool.wakeOne`).
        let startMonitor = pool.monitor.armIfAsleep()
        pool.lock.unlock()
        if startMonitor { pool.monitor.startThread() }
        isSearching = true
        return true
    }

    /// A worker about to park, its permit given back: if another worker's
    /// slot holds a unit, waits out `slotGrace` and takes the unit if it is
    /// still the same one (its owner is still running the item that
    /// submitted it), into its own ring. A slot filled after this look is
    /// announced to a pool that counts this worker parked, so a look is
    /// enough. `workers`: the pool's, as the parking worker just read them.
    /// Returns whether it took one.
    private func stealStaleSlot(_ workers: [PoolWorker]) -> Bool {
        var seen: [(PoolWorker, UInt64)] = []
        for worker in workers where worker !== self {
            if let word = worker.slot.fullWord { seen.append((worker, word)) }
        }
        if seen.isEmpty { return false }
        let deadline = MonotonicClock.now.advanced(by: Self.slotGrace)
        while MonotonicClock.now < deadline {
            for _ in 0..<16 { spinLoopHint() }
            // Every owner has taken its unit back: nothing to wait for.
            if !seen.contains(where: { $0.0.slot.fullWord == $0.1 }) { return false }
        }
        for (victim, word) in seen {
            if let unit = victim.slot.steal(ifStill: word) {
                ring.push(unit)
                return true
            }
        }
        return false
    }

    /// After `idleExit` without work: a worker beyond `width` leaves the pool.
    private func retireIfSpare() -> Bool {
        pool.lock.lock()
        defer { pool.lock.unlock() }
        guard pool.threadCount > pool.width,
              let i = pool.idle.firstIndex(where: { $0 === self })
        else { return false }
        pool.idle.remove(at: i)
        pool.workers.removeAll { $0 === self }
        pool.threadCount -= 1
        // A worker that parked because the pool was over width may still
        // hold units it pushed itself: they go to the injector, where the
        // remaining workers find them.
        moveQueuedWork(to: pool.defaultInjector)
        return true
    }

    /// Hands this parked worker a permit (the waker counted it), waking it
    /// on its futex or, if it waits in the pool's poller, through the
    /// poller's wake word. The park word's store pairs with the acquiring
    /// loads in `park` and `holdPoller`; with the load of `pollingWord` it
    /// is the waker's half of a Dekker pair (see `holdPoller`).
    func unpark() {
        AtomicMemory.store(0, to: parkWord, ordering: .sequentiallyConsistent)
        if AtomicMemory.load(from: pollingWord, ordering: .sequentiallyConsistent) != 0 {
            pool.poller?.wake()
        } else {
            Futex(parkWord).wake()
        }
    }

    /// Asks this parked worker to take the pool's poller, without a permit:
    /// it leaves its futex wait, takes the poller if nobody holds it, and
    /// waits there, still parked (the eager hand-off, see `PoolPoller`).
    /// Nothing of a wake-up with a permit (searching, spinning, parking
    /// again) is paid for it. The pool's lock is held, and the worker is on
    /// the idle list, so parked (1 or 2). Returns false if it was poked
    /// already. The caller wakes its futex (`wakeAfterPoke`) once it has
    /// let the lock go.
    func pokeForPoller() -> Bool {
        AtomicMemory.compareAndSwap(expected: 1, desired: 2, at: parkWord, ordering: .sequentiallyConsistent)
    }

    /// The futex wake of a poke (`pokeForPoller`).
    func wakeAfterPoke() {
        Futex(parkWord).wake()
    }

    /// Whether the worker waits in the pool's poller (stale at once).
    var isPolling: Bool { AtomicMemory.load(from: pollingWord, ordering: .relaxed) != 0 }

    // MARK: BlockingObserver

    override func willBlock() {
        gaveUpPermit = !dispatchingWhileParked
        guard gaveUpPermit else { return }
        if Progress.state(of: progress) == .running {
            AtomicMemory.store(Progress.word(units: unitsStarted, .inSpindleWait), to: progressWord, ordering: .relaxed)
        }
        flushSlot()
        AtomicMemory.add(-1, to: pool.active, ordering: .sequentiallyConsistent)
        // Work queued, or nobody waiting in the poller while something is
        // watched (the item may be waiting for an event): wake a worker.
        if pool.hasQueuedWork() || pool.poller?.wantsHolder == true {
            pool.notifyIfNeeded()
        }
    }

    override func didUnblock() {
        guard gaveUpPermit else { return }
        if Progress.state(of: progress) == .inSpindleWait {
            AtomicMemory.store(Progress.word(units: unitsStarted, .running), to: progressWord, ordering: .relaxed)
        }
        AtomicMemory.add(1, to: pool.active, ordering: .sequentiallyConsistent)
    }
}
