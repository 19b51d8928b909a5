import CShims

/// The watch of a signal source. Signals are process-wide, so one registry
/// serves every signal source: the first source of a signal installs
/// Spindle's observer for it (`cshims_signal_watch_install`: a `sigaction`
/// handler that counts the delivery, writes one eventfd, and then does what
/// the replaced disposition meant), and the last one to be cancelled puts
/// the saved disposition back. The observer writes an eventfd per place
/// that waits for signal sources: one watched in the pool's poller, for
/// sources on work queues (the worker that sees it runs their calls), one
/// on the reactor thread, for sources on loops (a loop cannot wait for a
/// process-wide mechanism itself). When one is readable, each source of its
/// registry gets the deliveries of its signal counted since it last looked.
///
/// No signal mask is touched (signalfd would need the signal blocked in
/// every thread, which a library cannot arrange for threads it did not
/// make), so any thread may take the signal.
final class SignalWatch: SourceWatch, @unchecked Sendable {
    // @unchecked: `home` and `stopped` are guarded by `lock`; `seen`,
    // `source` and `registered` by the registry's lock (taken inside
    // `lock`, never the other way round).

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

    init(signal: Int32) { self.signal = signal }

    var isProcessWide: Bool { true }

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
        let failure: EventSourceError? = lock.withLock {
            guard !stopped, home == nil else { return nil }
            let registry = Registry.at(placement)
            do throws(EventSourceError) {
                try registry.add(self, for: source, seen: nil)
                home = registry
                return nil
            } catch {
                return error
            }
        }
        // Outside the lock: failing cancels, and cancelling stops.
        if let failure { source.fail(failure) }
    }

    /// Moves the watch between the pool's registry and the reactor's,
    /// keeping its count: no delivery is lost or counted twice, and the
    /// observer stays installed throughout.
    func move(for source: EventSource, to placement: WatchPlacement) {
        let failure: EventSourceError? = lock.withLock {
            let next = Registry.at(placement)
            guard !stopped, let old = home, old !== next else { return nil }
            let seen = old.remove(self, keepingObserver: true)
            home = nil
            do throws(EventSourceError) {
                try next.add(self, for: source, seen: seen)
                home = next
                return nil
            } catch {
                Registry.observers.release(signal)
                return error
            }
        }
        if let failure { source.fail(failure) }
    }

    var placementName: String? {
        lock.withLock { home.map { $0 === Registry.pool ? "pool" : "reactor" } }
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

    /// The signal sources of the process that wait in one place: the pool's
    /// poller (`pool`) or the reactor thread (`reactor`).
    final class Registry: @unchecked Sendable {
        // @unchecked: everything is guarded by `lock`.

        static let observers = Observers()
        /// Sources on work queues: their eventfd waits in the pool's poller.
        static let pool = Registry(slot: 0)
        /// Sources on loops: their eventfd waits on the reactor thread.
        static let reactor = Registry(slot: 1)

        /// The registry for a watch placed at `placement`.
        static func at(_ placement: WatchPlacement) -> Registry {
            if case .pool = placement { return pool }
            return reactor
        }

        /// The observers' eventfd slot (`cshims_signal_watch_set_eventfd`).
        private let slot: Int32
        private let lock = GuardLock()
        private var eventfd = ProcessWideDescriptor()
        private var watches: [Int32: [SignalWatch]] = [:]
        private var count = 0

        private init(slot: Int32) { self.slot = slot }

        /// Where this registry's eventfd is watched; starts the reactor for
        /// the reactor's registry (which may throw).
        private func home() throws(EventSourceError) -> ProcessWideHome {
            if slot == 0, let poller = WorkerPool.standard.poller { return .pool(poller) }
            return .loop(try EventReactor.loop())
        }

        /// Registers `watch` with `source`, counting deliveries from `seen`
        /// (nil: from now). Installs the signal's observer unless the watch
        /// brings its hold on it (`seen` given: a move).
        func add(_ watch: SignalWatch, for source: EventSource, seen: UInt64?) throws(EventSourceError) {
            // Before the lock: starting the reactor takes the reactor's
            // lock, which is never taken inside this one.
            let home = try home()
            lock.lock()
            defer { lock.unlock() }
            let fd = try eventfd.watch(at: home, EventSourceCalls.eventfd) { [unowned self] in self.deliver() }
            EventSourceCalls.setSignalEventfd(slot: slot, fd)
            if seen == nil {
                do throws(EventSourceError) {
                    try Self.observers.retain(watch.signal)
                } catch {
                    if count == 0 { eventfd.unwatch() }
                    throw error
                }
            }
            watch.source = source
            watch.seen = seen ?? EventSourceCalls.signalCount(watch.signal)
            watch.registered = true
            watches[watch.signal, default: []].append(watch)
            count += 1
        }

        /// Unregisters `watch` and returns its count; releases its hold on
        /// the observer unless `keepingObserver` (a move).
        func remove(_ watch: SignalWatch, keepingObserver: Bool) -> UInt64 {
            lock.lock()
            defer { lock.unlock() }
            // Not in the list: never added, or added in the parent before a
            // `fork()` (the child's registry starts empty).
            guard watch.registered, let index = watches[watch.signal]?.firstIndex(where: { $0 === watch }) else {
                return watch.seen
            }
            watch.registered = false
            watches[watch.signal]?.remove(at: index)
            if watches[watch.signal]?.isEmpty ?? false { watches[watch.signal] = nil }
            if !keepingObserver { Self.observers.release(watch.signal) }
            count -= 1
            // Nothing left to wait for here: the poller may go unheld.
            if count == 0 { eventfd.unwatch() }
            return watch.seen
        }

        /// Where the eventfd waits, when it is readable: hands each source
        /// the deliveries of its signal since it last looked. The eventfd is
        /// drained first, so a signal counted after the counts are read
        /// writes it again and is delivered on the next round.
        private func deliver() {
            let fd = lock.withLock { eventfd.fd }
            EventSourceCalls.drainEventfd(fd)
            var due: [(EventSource, UInt64)] = []
            lock.withLock {
                for (signal, list) in watches {
                    let count = EventSourceCalls.signalCount(signal)
                    for watch in list where count != watch.seen {
                        if let source = watch.source { due.append((source, count &- watch.seen)) }
                        watch.seen = count
                    }
                }
            }
            for (source, count) in due { source.add(count) }
        }

        /// In a child after `fork()`: the parent's sources are not the
        /// child's, and the eventfd is shared with the parent. The observers
        /// stay installed (and keep chaining to the saved dispositions); the
        /// child's first signal source makes a new eventfd, which they then
        /// write.
        func childAfterFork() {
            lock.reinitializeAfterFork()
            eventfd.childAfterFork()
            EventSourceCalls.setSignalEventfd(slot: slot, -1)
            watches = [:]
            count = 0
        }
    }
}
