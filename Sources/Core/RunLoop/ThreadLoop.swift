import CShims

#if canImport(Glibc)
import Glibc
#endif

/// A thread's run loop: Spindle's `NSRunLoop`/`CFRunLoop`, on an io_uring
/// (or epoll) event backend.
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
public final class ThreadLoop: @unchecked Sendable {
    // @unchecked: configuration and queues are guarded by `lock`; run state
    // is touched only by the owning thread; the stop flag is atomic.

    /// The event backend this loop sleeps in.
    public let backend: any EventBackend
    /// The kernel thread id of the thread that owns (runs) the loop.
    public let ownerThreadID: Int32
    /// Unique per loop for the life of the process (addresses are reused).
    let serial: UInt64 = ThreadLoop.nextSerial()

    private static let serials = SerialCounter()
    private static func nextSerial() -> UInt64 { serials.next() }

    let lock = Lock()
    private var modes: [LoopMode: ModeItems] = [:]
    private var commonModeSet: Set<LoopMode> = [.default]
    private var common = ModeItems()
    private var performs: [PendingPerform] = []
    private var descriptors: [UInt64: DescriptorState] = [:]
    private var descriptorTokens: [ObjectIdentifier: UInt64] = [:]
    private var nextToken: UInt64 = 1
    /// Descriptor arming and disarming requested by other threads, applied
    /// by the owner at the start of its next pass.
    private var pendingArm: [UInt64] = []
    private var pendingDisarm: [(fd: Int32, token: UInt64)] = []
    private var threadHasExited = false
    private let stopFlag = UnsafeMutablePointer<UInt32>.allocate(capacity: 1)
    /// Run state (owner thread only).
    private var readyEvents: [ReadyEvent] = []
    private var runDepth = 0

    struct ModeItems {
        var sources: [LoopSource] = []
        var timers: [LoopTimer] = []
        var observers: [LoopObserver] = []
        var isEmpty: Bool { sources.isEmpty && timers.isEmpty }

        /// Inserts keeping `order` (stable: equal orders stay in the order added).
        mutating func insert(_ source: LoopSource) {
            let i = sources.firstIndex { $0.order > source.order } ?? sources.endIndex
            sources.insert(source, at: i)
        }

        mutating func insert(_ observer: LoopObserver) {
            let i = observers.firstIndex { $0.order > observer.order } ?? observers.endIndex
            observers.insert(observer, at: i)
        }
    }

    struct DescriptorState {
        let source: LoopSource
        let fd: Int32
        let interest: Readiness
        var pending: Readiness = []
        var armed = false
    }

    struct PendingPerform {
        let modes: [LoopMode]
        let block: () -> Void
        let completion: PerformCompletion?
    }

    init(backend: any EventBackend, owner: Int32) {
        self.backend = backend
        self.ownerThreadID = owner
        stopFlag.initialize(to: 0)
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
                loop.backend.kind == kind,
                "ThreadLoop.current(backend: \(kind)): this thread's loop already uses \(loop.backend.kind)")
            return loop
        }
        return try LoopRegistry.makeCurrent(throwing: kind)
    }

    /// The main thread's loop.
    public static var main: ThreadLoop { LoopRegistry.mainLoop() }

    /// Whether the calling thread owns this loop.
    public var isCurrent: Bool { cshims_gettid() == ownerThreadID }

    // MARK: - Modes

    /// The modes in the common-modes set (initially `[.default]`).
    public var commonModes: Set<LoopMode> { lock.withLock { commonModeSet } }

    /// Adds `mode` to the common-modes set: it gets every item added to
    /// `.common`, now and later. Any thread.
    public func addCommonMode(_ mode: LoopMode) {
        require(mode != .common, "ThreadLoop.addCommonMode: `.common` is the set itself, not a mode")
        var scheduled: [LoopSource] = []
        lock.withLock {
            guard commonModeSet.insert(mode).inserted else { return }
            var items = modes[mode, default: ModeItems()]
            for s in common.sources where !items.sources.contains(where: { $0 === s }) {
                items.sources.append(s)
                scheduled.append(s)
            }
            for t in common.timers where !items.timers.contains(where: { $0 === t }) { items.timers.append(t) }
            for o in common.observers where !items.observers.contains(where: { $0 === o }) { items.observers.append(o) }
            items.sources.sort { $0.order < $1.order }
            items.observers.sort { $0.order < $1.order }
            modes[mode] = items
        }
        for s in scheduled { s.onSchedule?(self, mode) }
        if !isCurrent { wakeUp() }
    }

    /// The concrete modes an addition to `mode` reaches.
    private func expand(_ mode: LoopMode) -> [LoopMode] {
        mode == .common ? Array(commonModeSet) : [mode]
    }

    // MARK: - Sources

    /// Adds `source` to `mode` (or every common mode for `.common`) and calls
    /// its `schedule` callback for each mode it joined. Any thread; wakes the
    /// loop. Adding it again is a no-op; an invalidated source is ignored.
    public func add(_ source: LoopSource, forMode mode: LoopMode = .default) {
        guard source.attach(self) else { return }
        var joined: [LoopMode] = []
        var arm = false
        lock.withLock {
            if mode == .common {
                if !common.sources.contains(where: { $0 === source }) { common.sources.append(source) }
            }
            for m in expand(mode) {
                // Mutated in place through the subscript: copying the items
                // out and back would copy their arrays on every add.
                guard !(modes[m]?.sources.contains { $0 === source } ?? false) else { continue }
                modes[m, default: ModeItems()].insert(source)
                joined.append(m)
            }
            if case .descriptor(let fd, let interest) = source.kind, descriptorTokens[ObjectIdentifier(source)] == nil {
                let token = nextToken
                nextToken += 1
                descriptorTokens[ObjectIdentifier(source)] = token
                descriptors[token] = DescriptorState(source: source, fd: fd, interest: interest)
                pendingArm.append(token)
                arm = true
            }
        }
        for m in joined { source.onSchedule?(self, m) }
        // The owner thread is not asleep: no wake-up, just arm now.
        if isCurrent {
            if arm { applyPendingChanges() }
        } else {
            wakeUp()
        }
    }

    /// Removes `source` from `mode` (or from `.common` and every common mode)
    /// and calls its `cancel` callback for each mode it left. Removing a
    /// source that was never added is a no-op. Any thread.
    public func remove(_ source: LoopSource, forMode mode: LoopMode = .default) {
        var left: [LoopMode] = []
        lock.withLock {
            if mode == .common { common.sources.removeAll { $0 === source } }
            for m in expand(mode) {
                guard let i = modes[m]?.sources.firstIndex(where: { $0 === source }) else { continue }
                modes[m]!.sources.remove(at: i)
                left.append(m)
            }
            forgetDescriptorIfUnused(source)
        }
        if !modes(containing: source) { source.detach(self) }
        for m in left { source.onCancel?(self, m) }
        if isCurrent { applyPendingChanges() } else { wakeUp() }
    }

    /// Removes `source` from every mode (invalidation).
    func removeEverywhere(_ source: LoopSource) {
        var left: [LoopMode] = []
        lock.withLock {
            common.sources.removeAll { $0 === source }
            for m in modes.keys {
                guard let i = modes[m]?.sources.firstIndex(where: { $0 === source }) else { continue }
                modes[m]!.sources.remove(at: i)
                left.append(m)
            }
            forgetDescriptorIfUnused(source)
        }
        for m in left { source.onCancel?(self, m) }
        if isCurrent { applyPendingChanges() } else { wakeUp() }
    }

    private func modes(containing source: LoopSource) -> Bool {
        lock.withLock { modes.values.contains { $0.sources.contains { $0 === source } } }
    }

    /// Drops a descriptor source's token once no mode holds it. Under `lock`.
    private func forgetDescriptorIfUnused(_ source: LoopSource) {
        guard let token = descriptorTokens[ObjectIdentifier(source)] else { return }
        guard !modes.values.contains(where: { $0.sources.contains { $0 === source } }) else { return }
        descriptorTokens[ObjectIdentifier(source)] = nil
        if let state = descriptors.removeValue(forKey: token), state.armed {
            pendingDisarm.append((state.fd, token))
        }
        pendingArm.removeAll { $0 == token }
    }

    /// Whether `source` is in `mode`.
    public func contains(_ source: LoopSource, inMode mode: LoopMode) -> Bool {
        lock.withLock {
            mode == .common
                ? common.sources.contains { $0 === source }
                : modes[mode]?.sources.contains { $0 === source } ?? false
        }
    }

    // MARK: - Timers

    /// Adds `timer` to `mode` (or every common mode). A timer belongs to one
    /// loop: adding it to a second loop is a precondition failure. Adding an
    /// invalidated timer is a no-op. Any thread; wakes the loop.
    public func add(_ timer: LoopTimer, forMode mode: LoopMode = .default) {
        timer.lock.withLock {
            if let owner = timer.loopSerial {
                require(owner == serial, "ThreadLoop.add(_:forMode:): this LoopTimer already belongs to another loop")
            }
            timer.loopSerial = serial
            timer.loop = self
        }
        guard timer.isValid else { return }
        lock.withLock {
            if mode == .common, !common.timers.contains(where: { $0 === timer }) { common.timers.append(timer) }
            for m in expand(mode) where !(modes[m]?.timers.contains { $0 === timer } ?? false) {
                modes[m, default: ModeItems()].timers.append(timer)
            }
        }
        if !isCurrent { wakeUp() }
    }

    /// Removes `timer` from `mode` without invalidating it. A no-op if it was
    /// not there. Any thread.
    public func remove(_ timer: LoopTimer, forMode mode: LoopMode = .default) {
        lock.withLock {
            if mode == .common { common.timers.removeAll { $0 === timer } }
            for m in expand(mode) { modes[m]?.timers.removeAll { $0 === timer } }
        }
    }

    /// Called by `LoopTimer.invalidate()`: drop it from every mode.
    func timerInvalidated(_ timer: LoopTimer) {
        lock.withLock {
            common.timers.removeAll { $0 === timer }
            for m in modes.keys { modes[m]?.timers.removeAll { $0 === timer } }
        }
        if !isCurrent { wakeUp() }
    }

    // MARK: - Observers

    /// Adds `observer` to `mode` (or every common mode). Any thread.
    public func add(_ observer: LoopObserver, forMode mode: LoopMode = .default) {
        guard observer.isValid else { return }
        lock.withLock {
            if mode == .common, !common.observers.contains(where: { $0 === observer }) { common.observers.append(observer) }
            for m in expand(mode) where !(modes[m]?.observers.contains { $0 === observer } ?? false) {
                modes[m, default: ModeItems()].insert(observer)
            }
        }
    }

    /// Removes `observer` from `mode`; a no-op if it was not there.
    public func remove(_ observer: LoopObserver, forMode mode: LoopMode = .default) {
        lock.withLock {
            if mode == .common { common.observers.removeAll { $0 === observer } }
            for m in expand(mode) { modes[m]?.observers.removeAll { $0 === observer } }
        }
    }

    // MARK: - Waking and stopping

    /// Wakes the loop if it sleeps, or makes its next sleep return at once.
    /// Any thread; a system call only when the loop is asleep.
    public func wakeUp() {
        backend.wake()
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
    public func run(
        mode: LoopMode = .default, timeout: Duration, returnAfterSourceHandled: Bool = false
    ) -> LoopRunResult {
        require(timeout >= .zero, "ThreadLoop.run: `timeout` is \(timeout); it cannot be negative")
        return run(mode: mode, until: MonotonicClock.now.advanced(by: timeout), returnAfterSourceHandled: returnAfterSourceHandled)
    }

    /// As `run(mode:timeout:returnAfterSourceHandled:)`, until `deadline`.
    @discardableResult
    public func run(
        mode: LoopMode = .default, until deadline: MonotonicClock.Instant, returnAfterSourceHandled: Bool = false
    ) -> LoopRunResult {
        require(
            isCurrent,
            "ThreadLoop.run: called on thread \(cshims_gettid()), but the loop belongs to thread \(ownerThreadID); only its own thread runs a loop")
        require(mode != .common, "ThreadLoop.run: `.common` is a set of modes; run in one of them")
        if isEmpty(mode) { return .finished }
        runDepth += 1
        defer { runDepth -= 1 }
        notify(.entry, mode)
        var result: LoopRunResult?
        repeat {
            applyPendingChanges()
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
                _ = backend.wait(until: wakeAt, events: &readyEvents)
                record(readyEvents)
                if !poll { notify(.afterWaiting, mode) }
            }
            fireDueTimers(mode)
            if fireReadyDescriptors(mode, stopAfterOne: returnAfterSourceHandled && !handled) { handled = true }
            if runPerforms(mode) { handled = true }
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
    public func run(until deadline: MonotonicClock.Instant) {
        while MonotonicClock.now < deadline {
            switch run(mode: .default, until: deadline) {
            case .stopped, .finished: return
            case .timedOut, .handledSource: continue
            }
        }
    }

    // MARK: - Pass steps (owner thread)

    /// Whether `mode` has no sources, no valid timers and no performs.
    func isEmpty(_ mode: LoopMode) -> Bool {
        lock.withLock {
            if let items = modes[mode] {
                if !items.sources.isEmpty { return false }
                if items.timers.contains(where: { $0.isValid }) { return false }
            }
            return !performs.contains { $0.matches(mode, commonModeSet) }
        }
    }

    private func notify(_ activity: LoopActivity, _ mode: LoopMode) {
        let observers: [LoopObserver] = lock.withLock {
            guard modes[mode]?.observers.isEmpty == false else { return [] }
            modes[mode]!.observers.removeAll { !$0.isValid }
            return modes[mode]!.observers.filter { $0.activities.contains(activity) }
        }
        for o in observers where o.isValid {
            if !o.repeats { o.invalidate() }
            o.handler(o, activity)
        }
    }

    /// Runs the performs queued for `mode`; returns whether it ran any.
    @discardableResult
    private func runPerforms(_ mode: LoopMode) -> Bool {
        let batch: [PendingPerform] = lock.withLock {
            guard !performs.isEmpty else { return [] }
            var taken: [PendingPerform] = []
            var kept: [PendingPerform] = []
            for p in performs {
                if p.matches(mode, commonModeSet) { taken.append(p) } else { kept.append(p) }
            }
            performs = kept
            return taken
        }
        for p in batch {
            p.block()
            p.completion?.finish(ran: true)
        }
        return !batch.isEmpty
    }

    private func fireSignaledSources(_ mode: LoopMode, stopAfterOne: Bool) -> Bool {
        let sources: [LoopSource] = lock.withLock { modes[mode]?.sources.filter { $0.kind == .custom } ?? [] }
        var handled = false
        for s in sources where s.consumeSignal() {
            guard s.isValid else { continue }
            s.onPerform?(s)
            handled = true
            if stopAfterOne { break }
        }
        return handled
    }

    private func nextTimerDeadline(_ mode: LoopMode) -> MonotonicClock.Instant {
        let timers: [LoopTimer] = lock.withLock { modes[mode]?.timers ?? [] }
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
            (modes[mode]?.timers ?? []).filter { $0.isValid && $0.fireDate <= now }
        }.sorted { $0.fireDate < $1.fireDate }
        for t in due where t.beginFiring(now: now) {
            t.handler(t)
            if !t.isValid { timerInvalidated(t) }
        }
    }

    private func record(_ events: [ReadyEvent]) {
        guard !events.isEmpty else { return }
        lock.withLock {
            for e in events {
                guard var state = descriptors[e.token] else { continue }
                state.pending.formUnion(e.readiness)
                state.armed = false
                descriptors[e.token] = state
            }
        }
    }

    private func hasReadyDescriptor(_ mode: LoopMode) -> Bool {
        lock.withLock {
            descriptors.values.contains { state in
                !state.pending.isEmpty && (modes[mode]?.sources.contains { $0 === state.source } ?? false)
            }
        }
    }

    private func fireReadyDescriptors(_ mode: LoopMode, stopAfterOne: Bool) -> Bool {
        let ready: [(UInt64, LoopSource, Readiness)] = lock.withLock {
            guard let items = modes[mode] else { return [] }
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
            lock.withLock { if descriptors[token] != nil { pendingArm.append(token) } }
        }
        if !ready.isEmpty { applyPendingChanges() }
        return !ready.isEmpty
    }

    /// Applies descriptor arming/disarming queued by any thread. Owner only.
    func applyPendingChanges() {
        let (arms, disarms): ([(Int32, Readiness, UInt64)], [(fd: Int32, token: UInt64)]) = lock.withLock {
            guard !pendingArm.isEmpty || !pendingDisarm.isEmpty else { return ([], []) }
            var arms: [(Int32, Readiness, UInt64)] = []
            for token in pendingArm {
                guard var state = descriptors[token], !state.armed else { continue }
                state.armed = true
                descriptors[token] = state
                arms.append((state.fd, state.interest, token))
            }
            let disarms = pendingDisarm
            pendingArm.removeAll()
            pendingDisarm.removeAll()
            return (arms, disarms)
        }
        for d in disarms { backend.disarm(d.fd, token: d.token) }
        for (fd, interest, token) in arms {
            do {
                try backend.arm(fd, for: interest, token: token)
            } catch {
                misuse("ThreadLoop: cannot watch descriptor \(fd): \(error)")
            }
        }
    }

    // MARK: - Performs

    /// Queues `block` to run on this loop's thread during its next pass in
    /// one of `modes` (`.common` means any common mode). Performs run in
    /// the order queued, all those queued before a pass during that pass.
    /// Any thread; wakes the loop. With `waitUntilDone`, blocks the caller
    /// until the block has run; called on the loop's own thread it runs the
    /// block at once. Returns false if the block did not run (only possible
    /// with `waitUntilDone` when the loop's thread exited first).
    @discardableResult
    public func perform(
        inModes modes: [LoopMode] = [.common], waitUntilDone: Bool = false, _ block: @escaping () -> Void
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
    @discardableResult
    public func perform(
        afterDelay delay: Duration, inModes modes: [LoopMode] = [.default], target: AnyObject? = nil,
        _ block: @escaping () -> Void
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
            for items in modes.values { all += items.timers.filter { $0.target == id } }
            return all
        }
        for t in timers { t.invalidate() }
    }

    /// Called when the owning thread exits: performs still queued (and any
    /// sent later) cannot run; their waiters are released with `false`.
    func ownerThreadExited() {
        let dropped: [PendingPerform] = lock.withLock {
            threadHasExited = true
            defer { performs.removeAll() }
            return performs
        }
        for p in dropped { p.completion?.finish(ran: false) }
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

/// A process-wide counter handing out unique numbers.
final class SerialCounter: @unchecked Sendable {
    // @unchecked: the word is only accessed atomically and never freed.
    private let word: UnsafeMutablePointer<UInt64> = {
        let p = UnsafeMutablePointer<UInt64>.allocate(capacity: 1)
        p.initialize(to: 0)
        return p
    }()
    func next() -> UInt64 { AtomicMemory.increment(word, ordering: .relaxed) }
}
