import CShims

#if canImport(Glibc)
import Glibc
#endif

/// A thread's run loop: Spindle's `RunLoop` (Foundation's `NSRunLoop`,
/// Core Foundation's `CFRunLoop`), on an io_uring (or epoll) event backend.
///
/// A loop thread with a timer and a queued block (the catalog's article
/// <doc:RunningALoopThread> adds sources, a pipe, observers and modes):
///
/// ```swift
/// let worker = try LoopThread.start()            // a thread that runs its loop
/// let loop = worker.loop
///
/// let ticks = LockedValue(0)
/// let timer = LoopTimer(after: .milliseconds(100), interval: .milliseconds(100)) { _ in
///     ticks.withLock { $0 += 1 }                  // on the loop's thread
/// }
/// loop.add(timer)                                // from any thread
/// loop.perform { print("queued from another thread, run on the loop's") }
///
/// worker.stop()                                  // the loop's run returns
/// try worker.join()
/// ```
///
/// Every thread has at most one, made on first use (`ThreadLoop.current`).
/// A loop is run only by its own thread; everything else (adding and
/// removing sources, timers and observers, `wakeUp()`, `stop()`, performs)
/// works from any thread and wakes the loop if it needs to notice.
///
/// Each pass follows the guide's sequence of events: notify `entry` (once
/// per run); then per pass notify `beforeTimers` and `beforeSources`, run
/// queued performs (the guide's perform-selector sources: running one counts
/// as handling a source), fire signalled custom sources; if a descriptor source is
/// already ready skip to handling it, else notify `beforeWaiting`, sleep
/// until a descriptor is ready, a timer is due, the run's time is up or the
/// loop is woken, and notify `afterWaiting`; then fire due timers and ready
/// descriptor sources, run performs, and decide whether to return; finally
/// notify `exit`. A run in mode M involves only M's items; other modes'
/// events wait for a pass in their mode. Runs nest, in any mode.
///
/// Sleeping costs no CPU: the thread waits in the kernel (on its wake word
/// when it watches no descriptors, which is the fastest wake-up here).
///
/// When the thread exits, its loop lets go of its sources (each one's
/// `cancel` runs, once per mode, on the exiting thread), its timers (which
/// are invalidated) and its observers, and drops its queued performs; see
/// `ownerThreadExited`.
public final class ThreadLoop: @unchecked Sendable {
    // @unchecked: configuration and queues are guarded by `lock`; run state
    // is touched only by the owning thread; the stop flag is atomic. The
    // queued blocks are not `Sendable`: each came in `sending` and is called
    // once, by the owning thread (or inline by the caller, on that thread).

    /// The descriptors the loop watches, over the event backend it sleeps in.
    package let registry: EventRegistry
    /// The kernel thread id of the thread that owns (runs) the loop.
    public let ownerThreadID: Int32
    /// Names this loop to the sources and timers in it; outlives the loop.
    let identity: LoopIdentity

    let lock = GuardLock()
    /// The modes and their items. Guarded by `lock`.
    private var table: LoopModeTable
    private var performs: [PendingPerform] = []
    /// Swift concurrency jobs of actors bound to this loop (its
    /// `SerialExecutor` conformance), run in the common modes in order.
    /// Guarded by `lock`.
    private var jobs: [UnownedJob] = []
    /// The batch being run; swapped with `jobs` under the lock, so neither
    /// array reallocates once grown. Owner thread only.
    private var jobBatch: [UnownedJob] = []
    /// Descriptor sources by their registration in `registry`, with the
    /// readiness reported and not yet handled (held while the loop runs in
    /// a mode that does not hold the source). Guarded by `lock`.
    private var descriptors: [UInt64: DescriptorState] = [:]
    private var descriptorTokens: [ObjectIdentifier: UInt64] = [:]
    private var threadHasExited = false
    private let stopFlag = UnsafeMutablePointer<UInt32>.allocate(capacity: 1)
    /// Run state (owner thread only).
    private var readyEvents: [ReadyEvent] = []
    private var runDepth = 0
    /// The modes of the runs in progress, innermost last. Guarded by `lock`
    /// (written only by the owner thread, read by any).
    private var runningModes: [LoopMode] = []
    /// `runningModes`, for `currentMode` (call with `lock` held).
    var runningModesSnapshot: [LoopMode] { runningModes }

    struct DescriptorState {
        let source: LoopSource
        var pending: Readiness = []
    }

    struct PendingPerform {
        let modes: [LoopMode]
        let block: () -> Void
        let completion: PerformCompletion?
    }

    init(backend: any EventBackend, owner: Int32) {
        self.registry = EventRegistry(backend: backend)
        self.ownerThreadID = owner
        identity = LoopIdentity()
        table = LoopModeTable(for: identity)
        stopFlag.initialize(to: 0)
        // Before the loop is shared: from here on `identity.loop` is only read.
        identity.loop = self
    }

    deinit {
        stopFlag.deallocate()
        for p in performs { p.completion?.finish(ran: false) }
    }

    // MARK: - Getting a loop

    /// The calling thread's loop, made on first use with the preferred
    /// backend (`SPINDLE_EVENT_BACKEND`, else io_uring, else epoll).
    public static var current: ThreadLoop {
        if let loop = LoopRegistry.currentLoop() { return loop }
        return LoopRegistry.makeCurrent(kind: nil)
    }

    /// The calling thread's loop, made with backend `kind` if the thread has
    /// none yet. If it already has one of another kind, a precondition
    /// failure. Throws when the kernel refuses `kind`.
    public static func current(backend kind: EventBackendKind) throws(SystemCallError) -> ThreadLoop {
        if let loop = LoopRegistry.currentLoop() {
            require(
                loop.backendKind == kind,
                "ThreadLoop.current(backend: \(kind)): this thread's loop already uses \(loop.backendKind)")
            return loop
        }
        return try LoopRegistry.makeCurrent(throwing: kind)
    }

    /// The main thread's loop. Any thread may make it. The main thread takes
    /// it up the first time it asks for `current` or touches this loop in a
    /// way that checks `isCurrent` (adding, removing, running: so always
    /// before its first sleep); only then, on that thread, is the 1 ns timer
    /// slack of loop threads set.
    public static var main: ThreadLoop { LoopRegistry.mainLoop() }

    /// The kernel interface the loop sleeps in.
    public var backendKind: EventBackendKind { registry.kind }

    /// The loop's wake-up and wait counters.
    public var eventStatistics: EventBackendStatistics { registry.statistics }

    /// Whether the calling thread owns this loop. Never blocks and, on a
    /// thread that has a loop, makes no system call (see `LoopRegistry`).
    public var isCurrent: Bool { LoopRegistry.isOwner(self) }

    // MARK: - Modes

    /// The modes in the common-modes set (initially `[.default]`).
    public var commonModes: Set<LoopMode> { lock.withLock { table.commonModes } }

    /// The loop's modes: those that hold a source, timer or observer, and the
    /// common modes. A mode that is not common leaves the set when its last
    /// item leaves it, so modes used for a while cost nothing afterwards.
    /// Any thread; takes the loop's lock briefly; a snapshot.
    public var allModes: Set<LoopMode> { lock.withLock { table.allModes } }

    /// Adds `mode` to the common-modes set: it gets every item added to
    /// `.common`, now and later, and those sources' `schedule` callbacks run
    /// for it, on the calling thread. Any thread; wakes the loop.
    public func addCommonMode(_ mode: LoopMode) {
        require(mode != .common, "ThreadLoop.addCommonMode: `.common` is the set itself, not a mode")
        let scheduled = lock.withLock { table.addCommonMode(mode) } ?? []
        for s in scheduled { s.onSchedule?(self, mode) }
        if !isCurrent { wakeUp() }
    }

    // MARK: - Sources

    /// Adds `source` to `mode` (or every common mode for `.common`) and calls
    /// its `schedule` callback, on the calling thread, for each mode it
    /// joined. Any thread; wakes the loop if called from another thread.
    /// Adding it again is a no-op; an invalidated source is ignored, and so
    /// is any source once the loop's thread has exited. Takes
    /// the loop's lock, and within it the source's, briefly; allocates
    /// nothing for one mode once the mode's array has room. The loop's lock
    /// orders it: what the caller wrote before is visible to the loop thread
    /// when it fires the source.
    ///
    /// A descriptor source whose descriptor cannot be watched (not open; a
    /// regular file or directory, which is always ready) is not added: it
    /// fails at once, on the calling thread (see `LoopSource.failure`).
    public func add(_ source: LoopSource, forMode mode: LoopMode = .default) {
        let (joined, failure): (ChangedModes, DescriptorWatchError?) = lock.withLock {
            if threadHasExited { return (ChangedModes(), nil) }
            // Registered before it joins a mode, so a failure leaves no trace.
            let registered = descriptorTokens[ObjectIdentifier(source)] != nil
            if let failure = watchDescriptor(source) { return (ChangedModes(), failure) }
            let joined = table.insert(source, in: mode)
            // Not added after all (invalidated meanwhile): no registration.
            if joined.isEmpty && !registered { forgetDescriptor(source) }
            return (joined, nil)
        }
        if let failure {
            source.fail(failure)
            return
        }
        guard !joined.isEmpty else { return }
        joined.forEach { source.onSchedule?(self, $0) }
        sourcesChanged(descriptor: source.isDescriptor)
    }

    /// Removes `source` from `mode` (or from `.common` and every common mode)
    /// and calls its `cancel` callback, on the calling thread, for each mode
    /// it left. Removing a source that is not there is a no-op. Any thread;
    /// wakes the loop if called from another thread.
    public func remove(_ source: LoopSource, forMode mode: LoopMode = .default) {
        let left = lock.withLock {
            let (left, leftLoop) = table.remove(source, from: mode)
            if leftLoop { forgetDescriptor(source) }
            return left
        }
        cancelled(source, in: left)
    }

    /// Removes `source` from every mode and from `.common` (invalidation),
    /// calling `cancel` for each mode it left.
    func removeEverywhere(_ source: LoopSource) {
        let left = lock.withLock {
            let left = table.removeEverywhere(source)
            if !left.isEmpty { forgetDescriptor(source) }
            return left
        }
        cancelled(source, in: left)
    }

    /// After `source` left the modes `left`: its `cancel` callbacks, then
    /// the loop learns of the change.
    private func cancelled(_ source: LoopSource, in left: ChangedModes) {
        guard !left.isEmpty else { return }
        left.forEach { source.onCancel?(self, $0) }
        sourcesChanged(descriptor: source.isDescriptor)
    }

    /// After a source joined or left a mode: the owner applies descriptor
    /// changes at once (it is not asleep); another thread wakes the loop so
    /// that its next pass sees the change.
    private func sourcesChanged(descriptor: Bool) {
        if isCurrent {
            if descriptor { registry.applyChanges() }
        } else {
            wakeUp()
        }
    }

    /// Registers a descriptor source's descriptor with the registry, once
    /// per loop (the kernel learns of it at the owner's next pass); nothing
    /// for a custom source. Returns why the descriptor cannot be watched, if
    /// it cannot. Under `lock`.
    private func watchDescriptor(_ source: LoopSource) -> DescriptorWatchError? {
        guard case .descriptor(let fd, let interest) = source.kind,
            descriptorTokens[ObjectIdentifier(source)] == nil
        else { return nil }
        do {
            let token = try registry.register(fd, for: interest)
            descriptorTokens[ObjectIdentifier(source)] = token
            descriptors[token] = DescriptorState(source: source)
            return nil
        } catch {
            return error
        }
    }

    /// Ends a descriptor source's registration once no mode holds it; a
    /// readiness held for it is dropped. Nothing for a custom source. Under
    /// `lock`.
    private func forgetDescriptor(_ source: LoopSource) {
        guard source.isDescriptor, let token = descriptorTokens.removeValue(forKey: ObjectIdentifier(source))
        else { return }
        descriptors[token] = nil
        registry.deregister(token)
    }

    /// Watches the descriptor of `source` (made with `rearmsManually`) again
    /// after its readiness was handled. Any thread. On epoll the kernel is
    /// told at once; on io_uring (driven only by the loop's thread), or when
    /// the loop may be asleep outside the kernel, a call from another thread
    /// wakes the loop. Nothing if the source is not in this loop.
    func rearm(_ source: LoopSource) {
        let token = lock.withLock { descriptorTokens[ObjectIdentifier(source)] }
        guard let token else { return }
        if registry.rearmNow(token) && !isCurrent { wakeUp() }
    }

    /// Whether `source` is in `mode` (for `.common`: was added to `.common`
    /// and not removed from it). Takes the loop's lock briefly.
    public func contains(_ source: LoopSource, inMode mode: LoopMode) -> Bool {
        lock.withLock { table.contains(source, inMode: mode) }
    }

    /// Whether the loop's thread has exited, so the loop will never run
    /// again (true already while the sources' `cancel` callbacks of the
    /// thread's exit run). Takes the loop's lock briefly. Ports use it to
    /// tell their loop's death from an ordinary removal.
    var ownerThreadHasExited: Bool { lock.withLock { threadHasExited } }

    // MARK: - Timers

    /// Adds `timer` to `mode` (or every common mode). A timer belongs to one
    /// loop: adding it to a second loop is a precondition failure, even after
    /// the first is gone. Adding an invalidated timer is a no-op. Once the
    /// loop's thread has exited, adding a timer invalidates it (it now
    /// belongs to a loop that will never run). Any thread; wakes the loop if
    /// called from another thread. Takes the loop's lock briefly; allocates
    /// nothing for one mode once its array has room. The loop's lock orders
    /// it: what the caller wrote before is visible to the handler.
    public func add(_ timer: LoopTimer, forMode mode: LoopMode = .default) {
        timer.claim(for: identity)
        let dead = lock.withLock {
            if threadHasExited { return true }
            // Checked under the lock, after the claim: see LoopTimer.invalidate().
            if timer.isValidForAdd { table.insert(timer, in: mode) }
            return false
        }
        if dead {
            timer.invalidate()
        } else if !isCurrent {
            wakeUp()
        }
    }

    /// Removes `timer` from `mode` (or from `.common` and every common mode)
    /// without invalidating it. A no-op if it was not there. Any thread.
    public func remove(_ timer: LoopTimer, forMode mode: LoopMode = .default) {
        lock.withLock { table.remove(timer, from: mode) }
    }

    /// Called when a timer's fire date was set: a sleeping loop wakes to
    /// sleep until the right date; the loop's own thread needs nothing.
    func timerRescheduled() {
        if !isCurrent { wakeUp() }
    }

    /// Called by `LoopTimer.invalidate()` and after a one-shot fired: drop
    /// it from every mode.
    func timerInvalidated(_ timer: LoopTimer) {
        lock.withLock { table.removeEverywhere(timer) }
        if !isCurrent { wakeUp() }
    }

    // MARK: - Observers

    /// Adds `observer` to `mode` (or every common mode). Adding it again,
    /// adding an invalidated observer, or adding one once the loop's thread
    /// has exited, is a no-op. Any thread.
    public func add(_ observer: LoopObserver, forMode mode: LoopMode = .default) {
        guard observer.isValid else { return }
        lock.withLock {
            if !threadHasExited { table.insert(observer, in: mode) }
        }
    }

    /// Removes `observer` from `mode` (or from `.common` and every common
    /// mode); a no-op if it was not there. Any thread.
    public func remove(_ observer: LoopObserver, forMode mode: LoopMode = .default) {
        lock.withLock { table.remove(observer, from: mode) }
    }

    // MARK: - Waking and stopping

    /// Wakes the loop if it sleeps, or makes its next sleep return at once.
    /// Any thread; a system call only when the loop is asleep.
    public func wakeUp() {
        registry.wake()
    }

    /// Makes the innermost running `run` return `.stopped` after its current
    /// pass (or the next `run` call, if none is running). Any thread.
    public func stop() {
        AtomicMemory.store(1, to: stopFlag, ordering: .releasing)
        wakeUp()
    }

    // MARK: - Running

    /// Runs one `run` call in `mode`: passes until a source is handled (with
    /// `returnAfterSourceHandled`), `timeout` passes, `stop()` is called, or
    /// the mode has nothing left (`.finished`, returned at once, without
    /// observer notifications, when the mode is empty on entry). A zero
    /// timeout makes one pass without sleeping. Blocks the calling thread,
    /// which must own the loop (a precondition failure otherwise). Nests.
    @discardableResult
    @available(*, noasync, message: "runs the loop, blocking the thread that owns it; a loop runs on its own thread (`LoopThread`), not in async code")
    public func run(
        mode: LoopMode = .default, timeout: Duration, returnAfterSourceHandled: Bool = false
    ) -> LoopRunResult {
        require(timeout >= .zero, "ThreadLoop.run: `timeout` is \(timeout); it cannot be negative")
        return run(mode: mode, until: MonotonicClock.now.advanced(by: timeout), returnAfterSourceHandled: returnAfterSourceHandled)
    }

    /// As `run(mode:timeout:returnAfterSourceHandled:)`, until `deadline`.
    @discardableResult
    @available(*, noasync, message: "runs the loop, blocking the thread that owns it; a loop runs on its own thread (`LoopThread`), not in async code")
    public func run(
        mode: LoopMode = .default, until deadline: MonotonicClock.Instant, returnAfterSourceHandled: Bool = false
    ) -> LoopRunResult {
        require(
            isCurrent,
            "ThreadLoop.run: called on thread \(cshims_gettid()), but the loop belongs to thread \(ownerThreadID); only its own thread runs a loop")
        require(mode != .common, "ThreadLoop.run: `.common` is a set of modes; run in one of them")
        if isEmpty(mode) { return .finished }
        runDepth += 1
        lock.withLock { runningModes.append(mode) }
        defer {
            runDepth -= 1
            lock.withLock { _ = runningModes.popLast() }
        }
        notify(.entry, mode)
        var result: LoopRunResult?
        repeat {
            notify(.beforeTimers, mode)
            notify(.beforeSources, mode)
            // Performs are the guide's perform-selector sources: running one
            // counts as handling a source.
            var handled = runPerforms(mode)
            if !(handled && returnAfterSourceHandled) {
                if fireSignaledSources(mode, stopAfterOne: returnAfterSourceHandled) {
                    handled = true
                    _ = runPerforms(mode)
                }
            }
            let poll = handled || MonotonicClock.now >= deadline
            if !hasReadyDescriptor(mode) {
                if !poll { notify(.beforeWaiting, mode) }
                let wakeAt = poll ? MonotonicClock.Instant(nanoseconds: 0) : min(deadline, nextTimerDeadline(mode))
                readyEvents.removeAll(keepingCapacity: true)
                _ = registry.wait(until: wakeAt, events: &readyEvents)
                Perturbation.point(.loopWake)
                record(readyEvents)
                if !poll { notify(.afterWaiting, mode) }
            }
            fireDueTimers(mode)
            if fireReadyDescriptors(mode, stopAfterOne: returnAfterSourceHandled && !handled) { handled = true }
            // Performs queued meanwhile, like signalled custom sources, wait
            // for the next pass's step 4 (the guide's "go to step 2").
            if handled && returnAfterSourceHandled {
                result = .handledSource
            } else if MonotonicClock.now >= deadline {
                result = .timedOut
            } else if AtomicMemory.load(from: stopFlag, ordering: .relaxed) != 0
                && AtomicMemory.exchange(0, at: stopFlag, ordering: .acquiring) != 0
            {
                result = .stopped
            } else if isEmpty(mode) {
                result = .finished
            }
        } while result == nil
        notify(.exit, mode)
        return result!
    }

    /// Runs the loop in the default mode until it is stopped or has nothing
    /// left to do. Blocks the owning thread.
    @available(*, noasync, message: "runs the loop, blocking the thread that owns it; a loop runs on its own thread (`LoopThread`), not in async code")
    public func run() {
        while true {
            switch run(mode: .default, until: .distantFuture) {
            case .stopped, .finished: return
            case .timedOut, .handledSource: continue
            }
        }
    }

    /// Runs the loop in the default mode until `deadline`, `stop()`, or
    /// nothing is left to do. Blocks the owning thread.
    ///
    /// Makes at least one pass, even when `deadline` has passed already: with
    /// `.now` it is the guide's polling pass, which lets signalled sources,
    /// queued performs and due timers run without sleeping.
    @available(*, noasync, message: "runs the loop, blocking the thread that owns it; a loop runs on its own thread (`LoopThread`), not in async code")
    public func run(until deadline: MonotonicClock.Instant) {
        repeat {
            switch run(mode: .default, until: deadline) {
            case .stopped, .finished: return
            case .timedOut, .handledSource: continue
            }
        } while MonotonicClock.now < deadline
    }

    // MARK: - Pass steps (owner thread)

    /// Whether `mode` has no sources, no valid timers and no performs.
    func isEmpty(_ mode: LoopMode) -> Bool {
        lock.withLock {
            if let items = table.items(in: mode) {
                if !items.sources.isEmpty { return false }
                if items.timers.contains(where: { $0.isValid }) { return false }
            }
            if !jobs.isEmpty && (mode == .common || table.commonModes.contains(mode)) { return false }
            return !performs.contains { $0.matches(mode, table.commonModes) }
        }
    }

    /// Queues an actor's job for the loop's common modes and wakes the loop.
    /// False if the loop's thread has exited. Any thread.
    func enqueueJob(_ job: UnownedJob) -> Bool {
        let accepted: Bool = lock.withLock {
            guard !threadHasExited else { return false }
            jobs.append(job)
            return true
        }
        if accepted { wakeUp() }
        return accepted
    }

    /// Runs the jobs queued so far, in order, if `mode` is a common mode;
    /// returns whether it ran any. Owner thread.
    private func runJobs(_ mode: LoopMode) -> Bool {
        let any: Bool = lock.withLock {
            guard !jobs.isEmpty, mode == .common || table.commonModes.contains(mode) else { return false }
            swap(&jobs, &jobBatch)
            return true
        }
        guard any else { return false }
        let executor = UnownedSerialExecutor(ordinary: self)
        for job in jobBatch { job.runSynchronously(on: executor) }
        jobBatch.removeAll(keepingCapacity: true)
        return true
    }

    private func notify(_ activity: LoopActivity, _ mode: LoopMode) {
        let observers = lock.withLock { table.observers(in: mode) }
        for o in observers where o.activities.contains(activity) && o.isValid {
            if !o.repeats { o.invalidate() }
            o.handler(o, activity)
        }
    }

    /// Runs the performs queued for `mode`; returns whether it ran any.
    @discardableResult
    private func runPerforms(_ mode: LoopMode) -> Bool {
        let ranJobs = runJobs(mode)
        let batch: [PendingPerform] = lock.withLock {
            guard !performs.isEmpty else { return [] }
            var taken: [PendingPerform] = []
            var kept: [PendingPerform] = []
            for p in performs {
                if p.matches(mode, table.commonModes) { taken.append(p) } else { kept.append(p) }
            }
            performs = kept
            return taken
        }
        for p in batch {
            p.block()
            p.completion?.finish(ran: true)
        }
        return ranJobs || !batch.isEmpty
    }

    private func fireSignaledSources(_ mode: LoopMode, stopAfterOne: Bool) -> Bool {
        // The mode's array itself: no copy unless the mode changes meanwhile.
        let sources: [LoopSource] = lock.withLock { table.items(in: mode)?.sources ?? [] }
        var handled = false
        for s in sources where s.kind == .custom && s.consumeSignal() {
            guard s.isValid else { continue }
            s.onPerform?(s)
            handled = true
            if stopAfterOne { break }
        }
        return handled
    }

    /// The earliest fire date of `mode`'s valid timers, or nil.
    func earliestFireDate(_ mode: LoopMode) -> MonotonicClock.Instant? {
        lock.withLock {
            var earliest: MonotonicClock.Instant?
            for t in table.items(in: mode)?.timers ?? [] where t.isValid {
                let d = t.fireDate
                if earliest.map({ d < $0 }) ?? true { earliest = d }
            }
            return earliest
        }
    }

    private func nextTimerDeadline(_ mode: LoopMode) -> MonotonicClock.Instant {
        let timers: [LoopTimer] = lock.withLock { table.items(in: mode)?.timers ?? [] }
        var earliest = MonotonicClock.Instant.distantFuture
        for t in timers where t.isValid {
            let d = t.wakeDeadline
            if d < earliest { earliest = d }
        }
        return earliest
    }

    private func fireDueTimers(_ mode: LoopMode) {
        let now = MonotonicClock.now
        let due: [LoopTimer] = lock.withLock {
            (table.items(in: mode)?.timers ?? []).filter { $0.isValid && $0.fireDate <= now }
        }.sorted { $0.fireDate < $1.fireDate }
        for t in due where t.beginFiring(now: now) {
            t.handler(t)
            if !t.isValid { timerInvalidated(t) }
        }
    }

    /// Holds each reported readiness for its source until a pass in one of
    /// its modes; fails the sources whose descriptors cannot be watched.
    private func record(_ events: [ReadyEvent]) {
        guard !events.isEmpty else { return }
        let failed: [(LoopSource, DescriptorWatchError)] = lock.withLock {
            var failed: [(LoopSource, DescriptorWatchError)] = []
            for e in events {
                guard var state = descriptors[e.token] else { continue }
                if let failure = e.failure {
                    failed.append((state.source, failure))
                    continue
                }
                state.pending.formUnion(e.readiness)
                descriptors[e.token] = state
            }
            return failed
        }
        for (source, failure) in failed { source.fail(failure) }
    }

    private func hasReadyDescriptor(_ mode: LoopMode) -> Bool {
        lock.withLock {
            guard let items = table.items(in: mode) else { return false }
            return descriptors.values.contains { state in
                !state.pending.isEmpty && items.sources.containsIdentical(state.source)
            }
        }
    }

    private func fireReadyDescriptors(_ mode: LoopMode, stopAfterOne: Bool) -> Bool {
        let ready: [(UInt64, LoopSource, Readiness)] = lock.withLock {
            guard let items = table.items(in: mode) else { return [] }
            var out: [(UInt64, LoopSource, Readiness)] = []
            for s in items.sources {
                guard let token = descriptorTokens[ObjectIdentifier(s)], var state = descriptors[token], !state.pending.isEmpty
                else { continue }
                out.append((token, s, state.pending))
                state.pending = []
                descriptors[token] = state
                if stopAfterOne { break }
            }
            return out
        }
        for (token, source, readiness) in ready {
            source.onReady?(source, readiness)
            // Re-armed only if still registered: a no-op once the handler
            // invalidated the source (or it left the loop).
            if !source.rearmsManually { registry.rearm(token) }
        }
        return !ready.isEmpty
    }

    // MARK: - Performs

    /// Queues `block` to run on this loop's thread during its next pass in
    /// one of `modes` (`.common` means any common mode). Performs run in
    /// the order queued, all those queued before a pass during that pass.
    /// Any thread; wakes the loop. With `waitUntilDone`, blocks the caller
    /// until the block has run; called on the loop's own thread it runs the
    /// block at once. Returns false if the block did not run (only possible
    /// with `waitUntilDone` when the loop's thread exited first).
    ///
    /// `block` is `sending`: it runs at most once, on another thread, so
    /// the caller hands it over together with everything it captures. The
    /// compiler rejects a block that captures state the caller goes on
    /// using (a local `var` it mutates afterwards, a non-`Sendable` object
    /// it still holds), as it does for `Thread` and `DispatchQueue.async`;
    /// state it gives up (an object made for the block) needs no box. Share
    /// state through a `Sendable` value such as `LockedValue`.
    ///
    /// To wait for a value the block computes, use
    /// `performAndWait(inModes:_:)`; to queue from async code, the form
    /// without `waitUntilDone` (this one is `noasync`, since it may wait).
    @discardableResult
    @available(*, noasync, message: "may block until the loop runs the block; in async code queue it with `perform(inModes:_:)` or use `try await performReturning { ... }`")
    public func perform(
        inModes modes: [LoopMode] = [.common], waitUntilDone: Bool = false, _ block: sending @escaping () -> Void
    ) -> Bool {
        require(!modes.isEmpty, "ThreadLoop.perform: `modes` is empty; the block could never run")
        if waitUntilDone && isCurrent {
            block()
            return true
        }
        let completion = waitUntilDone ? PerformCompletion() : nil
        let accepted: Bool = lock.withLock {
            guard !threadHasExited else { return false }
            performs.append(PendingPerform(modes: modes, block: block, completion: completion))
            return true
        }
        guard accepted else { return false }
        wakeUp()
        return completion?.wait() ?? true
    }

    /// Queues `block` to run on this loop after `delay`, in `modes`, as a
    /// one-shot timer; `target` groups requests for
    /// `cancelPreviousPerformRequests(target:)`. Must be called on the
    /// loop's own thread (the guide's "perform after a delay on the current
    /// thread"). Returns the timer, which can also be invalidated directly.
    ///
    /// `block` is `sending`, as for `perform(inModes:waitUntilDone:_:)`: it
    /// runs at most once, on this loop's thread, and the timer that holds it
    /// is a `Sendable` object other threads can reach, so the caller hands
    /// the block over with what it captures.
    @discardableResult
    public func perform(
        afterDelay delay: Duration, inModes modes: [LoopMode] = [.default], target: AnyObject? = nil,
        _ block: sending @escaping () -> Void
    ) -> LoopTimer {
        require(isCurrent, "ThreadLoop.perform(afterDelay:): call it on the loop's own thread")
        require(delay >= .zero, "ThreadLoop.perform(afterDelay:): `delay` is \(delay); it cannot be negative")
        let timer = LoopTimer(
            fireAt: MonotonicClock.now.advanced(by: delay), target: target.map(ObjectIdentifier.init)
        ) { _ in block() }
        for m in modes { add(timer, forMode: m) }
        return timer
    }

    /// Cancels the delayed performs queued with `target` that have not run.
    public func cancelPreviousPerformRequests(target: AnyObject) {
        let id = ObjectIdentifier(target)
        let timers: [LoopTimer] = lock.withLock {
            var all: [LoopTimer] = []
            for items in table.modes { all += items.timers.filter { $0.target == id } }
            return all
        }
        for t in timers { t.invalidate() }
    }

    /// Called on the owning thread as it exits. Performs still queued (and
    /// any sent later) cannot run: their waiters are released with `false`.
    /// Every source leaves every mode, as if removed, and its `cancel`
    /// callback runs for each mode it left, on the exiting thread (the
    /// guide's cue for a client to stop sending it work); the source stays
    /// valid and may be added to another loop. Timers are invalidated (a
    /// timer belongs to one loop for good, and this one will never run
    /// again) and observers leave every mode (they stay valid), so that
    /// neither their handlers nor what those capture outlive the thread
    /// while something still holds the loop. From here on `add` ignores
    /// sources and observers and invalidates timers.
    func ownerThreadExited() {
        // Actor jobs still queued run now, on the owner: a dropped job would
        // leave its task suspended for good. Jobs they enqueue run too.
        // The last check and `threadHasExited` go under one hold of the lock,
        // so no job slips in between and is dropped.
        while true {
            _ = runJobs(.common)
            let drained: Bool = lock.withLock {
                guard jobs.isEmpty else { return false }
                threadHasExited = true
                return true
            }
            if drained { break }
        }
        let (dropped, removed, timers): ([PendingPerform], [(LoopSource, ChangedModes)], [LoopTimer]) =
            lock.withLock {
                threadHasExited = true
                defer { performs.removeAll() }
                let removed = table.removeAllSources()
                for (source, _) in removed { forgetDescriptor(source) }
                return (performs, removed, table.removeAllTimersAndObservers())
            }
        // Still the owner: stop watching the removed sources' descriptors now.
        registry.applyChanges()
        for p in dropped { p.completion?.finish(ran: false) }
        for (source, left) in removed { left.forEach { source.onCancel?(self, $0) } }
        for timer in timers { timer.invalidate() }
    }
}

extension ThreadLoop.PendingPerform {
    func matches(_ mode: LoopMode, _ commonModes: Set<LoopMode>) -> Bool {
        modes.contains(mode) || (modes.contains(.common) && commonModes.contains(mode))
    }
}

/// A waiter for a `perform(waitUntilDone: true)`: a futex word that the loop
/// sets to 1 (ran) or 2 (dropped).
final class PerformCompletion: @unchecked Sendable {
    // @unchecked: the word is only accessed atomically.
    private let word = UnsafeMutablePointer<UInt32>.allocate(capacity: 1)
    init() { word.initialize(to: 0) }
    deinit { word.deallocate() }

    func finish(ran: Bool) {
        AtomicMemory.store(ran ? 1 : 2, to: word, ordering: .releasing)
        Futex(word).wakeAll()
    }

    /// Blocks until `finish`; returns whether the block ran.
    func wait() -> Bool {
        while true {
            let v = AtomicMemory.load(from: word, ordering: .acquiring)
            if v != 0 { return v == 1 }
            _ = Futex(word).wait(expecting: 0)
        }
    }
}

/// A loop's identity for the sources and timers in it. It holds the loop
/// weakly and may outlive it: a timer keeps its loop's identity, so it is
/// told apart from every other loop's even after its loop is gone, and a
/// source records the loops that hold it by their identities.
final class LoopIdentity: @unchecked Sendable {
    // @unchecked: `loop` is written once, in the loop's init, before the
    // identity is reachable from any other thread; after that it is only
    // read, and a weak load is safe against the loop's deallocation.

    /// The loop, while it exists.
    weak var loop: ThreadLoop?
}
