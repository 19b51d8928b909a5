import CShims

/// The watch of a signal source. Signals are process-wide: the first
/// source of a signal installs Spindle's observer for it
/// (`cshims_signal_watch_install`: a `sigaction` handler that counts the
/// delivery, writes the eventfd of each place that waits for signal
/// sources, and then does what the replaced disposition meant), and the
/// last one to be cancelled puts the saved disposition back. The places: the
/// pool's poller, for sources on work queues (the worker that sees the
/// eventfd runs their calls), and each loop with signal sources, which
/// watches an eventfd of its own (`Registry`). When one is readable, each
/// source that waits there gets the deliveries of its signal counted since
/// it last looked.
///
/// No signal mask is touched (signalfd would need the signal blocked in
/// every thread, which a library cannot arrange for threads it did not
/// make), so any thread may take the signal.
final class SignalWatch: SourceWatch, @unchecked Sendable {
    // @unchecked: `home` and `stopped` are guarded by `lock`; `seen`,
    // `source`, `registered` and `waiter` by the registry's lock (taken
    // inside `lock`, never the other way round).

    let signal: Int32
    private let lock = GuardLock()
    /// The registry the watch is in, if any.
    private var home: Registry?
    /// Set by `stop`: a `start` or `move` that comes after it (a cancel
    /// racing the activation) registers nothing.
    private var stopped = false
    /// The observer's count when this source last looked.
    fileprivate var seen: UInt64 = 0
    fileprivate weak var source: EventSource?
    fileprivate var registered = false
    /// The loop that waits for this watch (nil on the pool).
    fileprivate var waiter: Registry.Waiter?

    init(signal: Int32) { self.signal = signal }

    static func validate(_ signal: Int32) throws(EventSourceError) {
        switch cshims_signal_watch_refusal(signal) {
        case 0: return
        case 2: throw .signalNotObservable(signal, reason: "the C library reserves it for its own threads")
        case 3: throw .signalNotObservable(signal, reason: "SIGKILL and SIGSTOP cannot be caught")
        case 4: throw .signalNotObservable(signal, reason: "it reports a fault of the thread that raised it (SIGILL, SIGBUS, SIGSEGV, SIGFPE), which an observer cannot handle later on another thread")
        default: throw .signalNotObservable(signal, reason: "it is not a signal number (1 to 64)")
        }
    }

    func start(for source: EventSource, at placement: WatchPlacement) {
        let outcome: Result<Registry.Attach, EventSourceError>? = lock.withLock {
            guard !stopped, home == nil else { return nil }
            let registry = Registry.at(placement)
            do throws(EventSourceError) {
                let attach = try registry.add(self, for: source, seen: nil, at: placement)
                home = registry
                return .success(attach)
            } catch {
                return .failure(error)
            }
        }
        Self.finish(outcome, for: source)
    }

    /// After `start` or `move`, outside the lock: failing cancels, and
    /// cancelling stops; a loop that cannot watch its eventfd fails its
    /// sources.
    private static func finish(_ outcome: Result<Registry.Attach, EventSourceError>?, for source: EventSource) {
        switch outcome {
        case .success(let attach): if let failure = attach.perform() { source.fail(failure) }
        case .failure(let error): source.fail(error)
        case nil: break
        }
    }

    /// Moves the watch between the pool and a loop, or between loops,
    /// keeping its count: no delivery is lost or counted twice, and the
    /// observer stays installed throughout.
    func move(for source: EventSource, to placement: WatchPlacement) {
        let outcome: Result<Registry.Attach, EventSourceError>? = lock.withLock {
            let next = Registry.at(placement)
            guard !stopped, let old = home else { return nil }
            let seen = old.remove(self, keepingObserver: true)
            home = nil
            do throws(EventSourceError) {
                let attach = try next.add(self, for: source, seen: seen, at: placement)
                home = next
                return .success(attach)
            } catch {
                Registry.observers.release(signal)
                return .failure(error)
            }
        }
        Self.finish(outcome, for: source)
    }

    var placementName: String? {
        lock.withLock { home?.placementName(of: self) }
    }

    func stop() {
        lock.withLock {
            stopped = true
            if let home { _ = home.remove(self, keepingObserver: false) }
            home = nil
        }
    }

    /// Which signals have an observer installed, and for how many watches in
    /// either registry: the first installs it, the last puts the saved
    /// disposition back.
    final class Observers: @unchecked Sendable {
        // @unchecked: `counts` is guarded by `lock`, taken inside a
        // registry's lock.
        private let lock = GuardLock()
        private var counts: [Int32: Int] = [:]

        func retain(_ signal: Int32) throws(EventSourceError) {
            lock.lock()
            defer { lock.unlock() }
            if counts[signal, default: 0] == 0 { try EventSourceCalls.installSignalObserver(signal) }
            counts[signal, default: 0] += 1
        }

        func release(_ signal: Int32) {
            lock.lock()
            defer { lock.unlock() }
            guard let count = counts[signal] else { return }
            if count > 1 {
                counts[signal] = count - 1
            } else {
                counts[signal] = nil
                EventSourceCalls.restoreSignal(signal)
            }
        }

        /// In a child after `fork()`: the parent's sources are not the
        /// child's; the observers stay installed (see `Registry`).
        func childAfterFork() {
            lock.reinitializeAfterFork()
            counts = [:]
        }
    }

    /// The signal sources of the process, by where they wait: the pool's
    /// poller (`pool`, for sources on work queues), or the loops (`loops`,
    /// for sources on loops).
    ///
    /// The pool's sources share one eventfd (the observers' slot 0), which
    /// the poller watches. On loops, each loop with signal sources waits
    /// for them itself: it has a `Waiter`, an eventfd in a slot of its own
    /// (2 and up) watched by a descriptor source in the loop, in every mode
    /// its signal sources use; the loop's thread hands its sources their
    /// deliveries and runs their calls with no other thread woken. When
    /// every slot is taken, a loop's sources wait on the reactor thread
    /// (slot 1), which hands each call to the loop, as before loops had
    /// slots.
    final class Registry: @unchecked Sendable {
        // @unchecked: everything is guarded by `lock`.

        static let observers = Observers()
        /// Sources on work queues: their eventfd waits in the pool's poller.
        static let pool = Registry(onPool: true)
        /// Sources on loops: each waits in its own loop (or the reactor's).
        static let loops = Registry(onPool: false)

        /// The registry for a watch placed at `placement`.
        static func at(_ placement: WatchPlacement) -> Registry {
            if case .pool = placement { return pool }
            return loops
        }

        /// The observers' slot of the pool's eventfd, and of the reactor's.
        private static let poolSlot: Int32 = 0
        private static let reactorSlot: Int32 = 1

        private let onPool: Bool
        private let lock = GuardLock()
        /// The pool's eventfd (the pool's registry only).
        private var eventfd = ProcessWideDescriptor()
        /// The loops that wait for signal sources, by loop (the loops'
        /// registry only).
        private var waiters: [ObjectIdentifier: Waiter] = [:]
        /// Each slot's eventfd, made on its first use and kept for the
        /// process: a waiter that ends leaves its descriptor to the slot's
        /// next waiter, so that no descriptor closes while a loop may still
        /// be taking its watch of it down.
        private var slotDescriptors = Registry.noSlotDescriptors
        /// The loops' slots no waiter uses.
        private var freeSlots = Registry.allLoopSlots
        /// The slots' descriptors and free list as a registry starts, made
        /// once: a child after `fork()` takes copies (no allocation, no
        /// generic code of the standard library's in the fork handler).
        private static let noSlotDescriptors = [Int32](repeating: -1, count: Int(CSHIMS_SIGNAL_WATCH_SLOTS))
        private static let allLoopSlots = Array((2..<CSHIMS_SIGNAL_WATCH_SLOTS).reversed())
        /// The pool's watches (the pool's registry only; a loop's are its
        /// waiter's).
        private var poolWatches: [SignalWatch] = []

        private init(onPool: Bool) { self.onPool = onPool }

        /// A loop that waits for signal sources itself: its slot's eventfd,
        /// the descriptor source that watches it, the modes it is in.
        fileprivate final class Waiter: @unchecked Sendable {
            // @unchecked: `source`, `modes`, `failure` and `watches` are
            // guarded by the registry's lock; the rest is immutable.
            let loop: ThreadLoop
            let slot: Int32
            let fd: Int32
            var source: LoopSource?
            var modes: Set<LoopMode> = []
            /// Why the loop could not watch the eventfd, once it could not.
            var failure: EventSourceError?
            /// The watches that wait here; the last to leave ends the waiter.
            var watches: [SignalWatch] = []

            init(loop: ThreadLoop, slot: Int32, fd: Int32) {
                self.loop = loop
                self.slot = slot
                self.fd = fd
            }

            var isReactor: Bool { slot == Registry.reactorSlot }
        }

        /// Registers `watch` with `source`, counting deliveries from `seen`
        /// (nil: from now), to wait at `placement`. Installs the signal's
        /// observer unless the watch brings its hold on it (`seen` given: a
        /// move). Returns what the caller does outside its locks.
        func add(
            _ watch: SignalWatch, for source: EventSource, seen: UInt64?, at placement: WatchPlacement
        ) throws(EventSourceError) -> Attach {
            // Before the lock: starting the reactor takes the reactor's
            // lock, which is never taken inside this one.
            var reactor: ThreadLoop? = nil
            if case .reactor = placement { reactor = try EventReactor.loop() }
            while true {
                lock.lock()
                let added: Attach?
                do throws(EventSourceError) {
                    added = try addLocked(watch, for: source, seen: seen, at: placement, reactor: reactor)
                } catch {
                    lock.unlock()
                    throw error
                }
                lock.unlock()
                if let added { return added }
                // Every loop slot is taken: the reactor waits for this loop.
                reactor = try EventReactor.loop()
            }
        }

        /// What is left of an `add` for its caller to do outside every
        /// lock: add a waiter's descriptor source to its loop in the modes
        /// it is not in yet (nothing on the pool). A loop that cannot watch
        /// the eventfd fails the waiter's sources then, and failing cancels
        /// them, which takes the watch's lock and the registry's.
        struct Attach {
            fileprivate var loop: ThreadLoop?
            fileprivate var source: LoopSource?
            fileprivate var modes: [LoopMode] = []
            /// The loop's refusal to watch the waiter's eventfd, if it came
            /// before this watch joined the waiter.
            fileprivate var failure: EventSourceError?

            /// Returns the loop's earlier refusal, which the caller fails
            /// its source with.
            func perform() -> EventSourceError? {
                if let failure { return failure }
                if let loop, let source { for mode in modes { loop.add(source, forMode: mode) } }
                return nil
            }
        }

        /// `add` under the lock. Nil when the watch needs the reactor
        /// (every loop slot taken) and `reactor` is nil.
        private func addLocked(
            _ watch: SignalWatch, for source: EventSource, seen: UInt64?, at placement: WatchPlacement,
            reactor: ThreadLoop?
        ) throws(EventSourceError) -> Attach? {
            var attach = Attach()
            var waiter: Waiter? = nil
            if case .pool(let poller) = placement {
                precondition(onPool, "SignalWatch.Registry: a pool placement in the loops' registry")
                let fd = try eventfd.watch(at: .pool(poller), EventSourceCalls.eventfd) { [unowned self] in self.deliver(nil) }
                EventSourceCalls.setSignalEventfd(slot: Self.poolSlot, fd)
            } else {
                let (loop, modes): (ThreadLoop, [LoopMode])
                if case .loop(let l, let m) = placement {
                    (loop, modes) = (l, m)
                } else {
                    (loop, modes) = (reactor!, [.default])
                }
                guard let (found, missing) = try self.waiter(for: loop, modes: modes, reactor: reactor) else { return nil }
                waiter = found
                attach = Attach(loop: found.loop, source: found.source, modes: missing, failure: found.failure)
            }
            if seen == nil {
                do throws(EventSourceError) {
                    try Self.observers.retain(watch.signal)
                } catch {
                    if let waiter { endIfUnused(waiter) } else if poolWatches.isEmpty { eventfd.unwatch() }
                    throw error
                }
            }
            watch.source = source
            watch.waiter = waiter
            let now = EventSourceCalls.signalCount(watch.signal)
            watch.seen = seen ?? now
            watch.registered = true
            if let waiter { waiter.watches.append(watch) } else { poolWatches.append(watch) }
            // A move that brings deliveries not yet handed over: the new
            // place looks at once rather than at the next signal.
            if watch.seen != now { EventSourceCalls.pokeEventfd(waiter?.fd ?? eventfd.fd) }
            return attach
        }

        /// The waiter of `loop`, in `modes` too: the existing one, a new one
        /// in a free slot, or the reactor's when every slot is taken (nil
        /// if `reactor` is not given then). The caller adds its watch to
        /// it, or ends it if unused (`endIfUnused`), and adds the waiter's
        /// descriptor source to its loop in the modes returned (`Attach`),
        /// outside the lock. Under the lock.
        private func waiter(
            for loop: ThreadLoop, modes: [LoopMode], reactor: ThreadLoop?
        ) throws(EventSourceError) -> (Waiter, missing: [LoopMode])? {
            var target = loop
            if waiters[ObjectIdentifier(loop)] == nil && loop !== reactor && freeSlots.isEmpty {
                guard let reactor else { return nil }
                target = reactor
            }
            let waiter: Waiter
            if let existing = waiters[ObjectIdentifier(target)] {
                waiter = existing
            } else {
                let slot = target === reactor ? Self.reactorSlot : freeSlots.last!
                var fd = slotDescriptors[Int(slot)]
                if fd < 0 {
                    fd = try EventSourceCalls.eventfd()
                    slotDescriptors[Int(slot)] = fd
                }
                if slot != Self.reactorSlot { freeSlots.removeLast() }
                waiter = Waiter(loop: target, slot: slot, fd: fd)
                let substitute = slot == Self.reactorSlot ? nil : EventSource.loopWatchSubstitute.withLock { $0 }
                waiter.source = LoopSource(
                    descriptor: substitute ?? fd,
                    failed: { [unowned self, weak waiter] _, error in
                        if let waiter { self.failSources(of: waiter, .watchFailed(error)) }
                    }
                ) { [unowned self, weak waiter] _, _ in
                    if let waiter { self.deliver(waiter) }
                }
                waiters[ObjectIdentifier(target)] = waiter
                EventSourceCalls.setSignalEventfd(slot: slot, fd)
            }
            // The reactor waits in its default mode, whatever the source's:
            // it hands the call to the source's loop, in the source's modes.
            let wanted: [LoopMode] = target === loop ? modes : [.default]
            let missing = wanted.filter { !waiter.modes.contains($0) }
            waiter.modes.formUnion(missing)
            return (waiter, missing)
        }

        /// `waiter`'s loop could not watch its eventfd: its sources fail
        /// (with nothing to wait in, they would never hear of a delivery).
        private func failSources(of waiter: Waiter, _ error: EventSourceError) {
            let sources = lock.withLock {
                guard waiters[ObjectIdentifier(waiter.loop)] === waiter else { return [EventSource]() }
                waiter.failure = error
                return waiter.watches.compactMap(\.source)
            }
            for source in sources { source.fail(error) }
        }

        /// Ends `waiter` if no watch waits there: its slot is free again,
        /// its descriptor kept for the slot's next waiter. Under the lock.
        private func endIfUnused(_ waiter: Waiter) {
            guard waiter.watches.isEmpty else { return }
            waiters[ObjectIdentifier(waiter.loop)] = nil
            waiter.source?.invalidate()
            waiter.source = nil
            EventSourceCalls.setSignalEventfd(slot: waiter.slot, -1)
            if !waiter.isReactor { freeSlots.append(waiter.slot) }
        }

        /// Unregisters `watch` and returns its count; releases its hold on
        /// the observer unless `keepingObserver` (a move).
        func remove(_ watch: SignalWatch, keepingObserver: Bool) -> UInt64 {
            lock.lock()
            defer { lock.unlock() }
            // Not in a list: never added, or added in the parent before a
            // `fork()` (the child's registry starts empty, and the parent's
            // waiters are not the child's to end).
            let waiter = watch.waiter.flatMap { waiters[ObjectIdentifier($0.loop)] === $0 ? $0 : nil }
            guard watch.registered,
                  let index = (waiter?.watches ?? poolWatches).firstIndex(where: { $0 === watch })
            else { return watch.seen }
            watch.registered = false
            watch.waiter = nil
            if !keepingObserver { Self.observers.release(watch.signal) }
            if let waiter {
                waiter.watches.remove(at: index)
                endIfUnused(waiter)
            } else {
                poolWatches.remove(at: index)
                // Nothing left to wait for here: the poller may go unheld.
                if poolWatches.isEmpty { eventfd.unwatch() }
            }
            return watch.seen
        }

        /// Where a watch waits now ("pool", "loop", "reactor").
        func placementName(of watch: SignalWatch) -> String {
            lock.withLock {
                if onPool { return "pool" }
                return watch.waiter?.isReactor ?? false ? "reactor" : "loop"
            }
        }

        /// When the eventfd of `waiter` (nil: the pool's) is readable: hands
        /// each source that waits there the deliveries of its signal since
        /// it last looked. The eventfd is drained first, so a signal counted
        /// after the counts are read writes it again and is delivered on
        /// the next round.
        private func deliver(_ waiter: Waiter?) {
            var due: [(EventSource, UInt64)] = []
            lock.withLock {
                if let waiter {
                    // Ended meanwhile: its slot's next waiter looks for itself.
                    guard waiters[ObjectIdentifier(waiter.loop)] === waiter else { return }
                    EventSourceCalls.drainEventfd(waiter.fd)
                } else {
                    EventSourceCalls.drainEventfd(eventfd.fd)
                }
                for watch in waiter?.watches ?? poolWatches {
                    let count = EventSourceCalls.signalCount(watch.signal)
                    guard count != watch.seen else { continue }
                    if let source = watch.source { due.append((source, count &- watch.seen)) }
                    watch.seen = count
                }
            }
            for (source, count) in due { source.add(count) }
        }

        /// In the parent before `fork()`: uses the generic types
        /// `childAfterFork` uses, so that their metadata exists (a debug
        /// build makes it on first use, under a runtime lock that another
        /// thread of the parent may hold at the fork).
        func prepareForFork() {
            lock.withLock {
                for waiter in waiters.values { if let source = waiter.source { _ = Unmanaged.passUnretained(source) } }
            }
        }

        /// In a child after `fork()`: the parent's sources are not the
        /// child's, and the eventfds are shared with the parent. The
        /// observers stay installed (and keep chaining to the saved
        /// dispositions); the child's first signal source makes new
        /// eventfds, which they then write. The parent's descriptors are
        /// forgotten, not closed, and the loops' watches of them left alone
        /// (the child has none of the parent's loops running).
        func childAfterFork() {
            lock.reinitializeAfterFork()
            eventfd.childAfterFork()
            for waiter in waiters.values {
                if let source = waiter.source { _ = Unmanaged.passRetained(source) }
            }
            if onPool {
                EventSourceCalls.setSignalEventfd(slot: Self.poolSlot, -1)
            } else {
                for slot in 1..<CSHIMS_SIGNAL_WATCH_SLOTS { EventSourceCalls.setSignalEventfd(slot: slot, -1) }
                slotDescriptors = Self.noSlotDescriptors
                freeSlots = Self.allLoopSlots
            }
            waiters = [:]
            poolWatches = []
        }
    }
}

extension SignalWatch {
    /// The generic types and conformances of this file's code, made in the
    /// parent before `fork()` (see `EventReactor.prepareForFork`).
    static func prepareForFork() {
        ForkHandlers.makeMetadata(
            (EventSource, UInt64).self, Registry.Waiter?.self, [ObjectIdentifier: Registry.Waiter].self,
            [ObjectIdentifier: Registry.Waiter].Values.Iterator.self, (ObjectIdentifier, Registry.Waiter).self,
            [Int32: Int].self, (Int32, Int).self, String?.self, [EventSource].self, [(EventSource, UInt64)].self,
            [SignalWatch].self, [LoopMode].self, [Int32].self, Set<LoopMode>.self, Range<Int32>.self,
            IndexingIterator<[EventSource]>.self, IndexingIterator<[(EventSource, UInt64)]>.self,
            IndexingIterator<[SignalWatch]>.self, IndexingIterator<[LoopMode]>.self,
            IndexingIterator<Range<Int32>>.self, ReversedCollection<Range<Int32>>.self, Int32?.self,
            Result<Registry.Attach, EventSourceError>?.self)
        ForkHandlers.makeConformance(error: EventSourceError.self)
        ForkHandlers.makeConformance(hashable: LoopMode.self)
        ForkHandlers.makeConformance(signedInteger: Int.self)
        ForkHandlers.makeConformance(collection: [EventSource].self)
        ForkHandlers.makeConformance(collection: [(EventSource, UInt64)].self)
        ForkHandlers.makeConformance(sequence: [SignalWatch].self)
        ForkHandlers.makeConformance(collection: [SignalWatch].self)
        ForkHandlers.makeConformance(sequence: [LoopMode].self)
        ForkHandlers.makeConformance(collection: [LoopMode].self)
        // `filter` on the modes: its `_ArrayProtocol` conformance (a
        // protocol the standard library does not let a module name).
        _ = [LoopMode]().filter { _ in true }
        ForkHandlers.makeConformance(bidirectional: [Int32].self)
        ForkHandlers.makeConformance(collection: [Int32].self)
        ForkHandlers.makeConformance(rangeReplaceable: [Int32].self)
        ForkHandlers.makeConformance(bidirectional: Range<Int32>.self)
        ForkHandlers.makeConformance(collection: Range<Int32>.self)
        ForkHandlers.makeConformance(sequence: ReversedCollection<Range<Int32>>.self)
    }
}
